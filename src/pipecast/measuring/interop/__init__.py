"""Formats of other pipeline stacks: pipecast's plans written in their terms."""
