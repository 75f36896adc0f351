"""server: the gRPC service, configuration, command line and metrics."""
