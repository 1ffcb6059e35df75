"""The node agent: collectors and the pusher; imports no Django."""
