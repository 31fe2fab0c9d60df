"""PySpark integration: the `mergetxn` data source (Spark 4 Python Data Source API)."""
