"""Part files and storage: Parquet writing and reading, the storage backends (fsspec), the
rewrites of compaction and mutation, Arrow datasets."""
