"""The workers' protobuf <-> engine conversions (the shared gRPC plumbing is ``common/rpc``)."""
