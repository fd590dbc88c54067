"""The paged recurrent memory reader (MemAgent-style): ``--policy memory-reader`` (``agent.memory_reader.policy``)."""
