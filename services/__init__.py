"""Baton's services: the engine (model + cache), prefill, decode, HiCache and transfer."""
