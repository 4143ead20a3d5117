"""The decode worker: reserves room for a request, receives its prefilled state, generates."""
