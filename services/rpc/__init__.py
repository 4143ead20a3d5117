"""gRPC plumbing shared by the services: protobuf conversions and the one error interceptor."""
