"""The router: admits client requests (gRPC), tokenizes them, and drives a prefill and a decode worker."""
