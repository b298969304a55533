"""The cluster: the `/ws/peer` channel, peer authentication, membership, and worker mode
(docs/design/cluster.md).

`channel.py` (framing and crypto, pure), `messages.py` (the peer messages), `auth.py` (join tokens,
credentials, proofs, throttling), `store.py` (all SQL), `registry.py` (who is known and connected),
`peer.py` (one authenticated session, both ends), `dialer.py` (reconnecting peer client),
`service.py` (the node's peer hub), `credentials.py` (joining, proving, rotation), `upkeep.py` (its
stale, revocation and discovery loops), `routes.py` (`/ws/peer`, admin peer routes, `/cluster/health`).
"""
