"""Generated ``*_pb2`` / ``*_pb2_grpc`` modules land here (``make proto``); they are not committed."""
