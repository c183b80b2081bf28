"""Tests of the transport broker against real local sockets."""
