"""streamjudge: live judging of streamed RAG answers, OpenTelemetry-native."""

__version__ = "0.1.0"
