"""What a run is: the typed config, its sections and checks, YAML, and the keyed randomness every choice derives from."""
