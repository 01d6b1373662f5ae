"""Signal path and engines: audio I/O, STFT features, offline enhancement (and later streaming and the CLI)."""
