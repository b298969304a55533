"""The dashboard: server-rendered pages under `/ui` that read and act through the admin API in process."""
