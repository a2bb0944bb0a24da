"""Messages and their flood: the wire formats, who takes part in each step, the flood state machine, the transport interface, the protocol's shared rules and the lockstep reference."""
