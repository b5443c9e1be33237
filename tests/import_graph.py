"""A helper of the architecture tests: the first cycle of a directed graph, said as an assertion."""

from __future__ import annotations


def assert_acyclic(graph: dict, what: str = "import cycle") -> None:
    """Depth-first over ``graph`` (node -> its successors): an AssertionError naming the first cycle found."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                raise AssertionError(f"{what}: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
