"""Byte runs copied between flat byte buffers: a handoff's gather of scattered cache bytes into staging."""
