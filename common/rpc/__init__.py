"""gRPC plumbing every Baton server shares: the one exception-to-status interceptor and non-blocking
work when a call ends."""
