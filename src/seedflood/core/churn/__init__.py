"""One agreed history under churn: the agreement's rules and a client's voter over its flood."""
