"""The wire between clients and replicas: framed RPC over TCP, and TLS and credentials."""
