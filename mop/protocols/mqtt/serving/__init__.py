"""The trio side of MQTT: the adapter, the server shared by connections, one handler per client,
and what outlives connections (session registry, retained messages, timers, `$SYS`).

It carries out what the pure core in `mop.protocols.mqtt` decides, through the processor.
"""
