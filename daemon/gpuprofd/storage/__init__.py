"""Storage: the schema (defined once), the writer, the reads, retention.

May import sampling's sample types and rollups; never ingest, commands or the web app.
"""
