"""Protocol adapters, each a pure core (codec, state machines, rules) and a trio `serving`
part that the node loads through the `mop.protocols` entry points (see `base`)."""
