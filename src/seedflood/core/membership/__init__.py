"""Who takes part in each step: the notes that flood, the roster and its changes, and the graph's
growth (new ids' edges, graph repair), all pure functions of the committed history."""
