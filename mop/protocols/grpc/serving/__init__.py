"""The gRPC adapter's serving part (trio): the HTTP/2 server and the method handlers."""
