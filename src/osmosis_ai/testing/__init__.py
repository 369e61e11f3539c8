"""Fakes shipped for users and for our own tests: real servers on 127.0.0.1, not mocks."""
