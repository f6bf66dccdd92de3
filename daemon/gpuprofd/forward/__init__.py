"""Forwarding a node's runs to a team server: the outbox is sent in order,
acknowledged events are forgotten (:mod:`gpuprofd.forward.forwarder`)."""
