"""gRPC plumbing shared by the services: the workers' protobuf conversions and the one error interceptor."""
