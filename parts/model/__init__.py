"""A part's metadata record (``PartMeta``), pure."""
