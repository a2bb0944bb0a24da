"""One ZO update as a message, and its frame formats: the lowest layer every other part reads."""
