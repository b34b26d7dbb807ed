"""What a stored chunk is, as bytes: content keys, the checksummed entry format, its int4
codec, and what an entry must match to be linked (the bottom layer of ``ragpic.cache``)."""
