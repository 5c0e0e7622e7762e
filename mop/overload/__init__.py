"""Overload protection: how fast clients may connect and publish, and what the node does when
its memory passes a high-water mark.

`buckets` and `watermark` are the pure rules (time and memory come in as numbers); `guard` is
the state the adapters consult, and `memory` samples the process's memory at the edge.
"""
