"""MQTT 3.1, 3.1.1 and 5.0: the pure protocol core (codec, connection state machine, session
state, CONNECT negotiation, error and reason-code tables), with no I/O and no trio.

The trio side that serves clients on top of the messaging processor is `mop.protocols.mqtt.serving`.
"""
