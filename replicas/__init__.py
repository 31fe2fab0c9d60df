"""The replica process: follows the CSN log, runs transactions, serves snapshots."""
