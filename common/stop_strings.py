"""Where a stop string ends a request's text: one rule for the engine's ``LLM`` and the router."""


def stop_cut(text: str, stops: tuple[str, ...], include_stop: bool = False) -> int | None:
    """The length ``text`` is cut to at its earliest stop string, or None when it holds none.

    Args:
        text: the output decoded so far.
        stops: the request's stop strings (``SamplingParams.stop``).
        include_stop: keep the matched stop string (``include_stop_str_in_output``).

    Returns:
        The end of the kept text: where the earliest match starts, or where it ends with
        ``include_stop``. Of several matches at one position, the least string (in code point order)
        is the match.
    """
    hits = [(text.find(stop), stop) for stop in stops if stop in text]
    if not hits:
        return None
    position, stop = min(hits)
    return position + len(stop) if include_stop else position
