"""The Rényi orders at which every RDP figure here is computed (dp-accounting's accountant, the second
computation, the ledger's curves)."""

# RDP orders: Opacus's defaults (1.1 .. 10.9 by 0.1, 12 .. 63) extended to large orders, which small
# sampling rates with few steps need; a denser grid only lowers (tightens) the epsilon.
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) + [80, 96, 128, 192, 256, 512, 1024])
