"""A PromQL syntax check for the tests of the dashboard and the alert rules.

``metric_names(expr)`` parses one expression and returns the metric names it selects;
it raises ``PromQLError`` (with the position) for what Prometheus would refuse to parse:
unbalanced brackets, an unknown function or aggregation, a range where an instant vector
is needed and the like. It covers the language these files use (selectors with matchers,
ranges, subqueries, offsets, functions, aggregations with by/without before or after the
arguments, binary operators with bool, on/ignoring and group_left/right, unary minus,
numbers, durations, strings); it does not type-check function arguments beyond
instant-versus-range vectors, nor evaluate anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FUNCTIONS = {
    # name -> the positions of its range-vector arguments
    "abs": (),
    "absent": (),
    "absent_over_time": (0,),
    "avg_over_time": (0,),
    "ceil": (),
    "changes": (0,),
    "clamp": (),
    "clamp_max": (),
    "clamp_min": (),
    "count_over_time": (0,),
    "day_of_week": (),
    "delta": (0,),
    "deriv": (0,),
    "exp": (),
    "floor": (),
    "histogram_quantile": (),
    "holt_winters": (0,),
    "hour": (),
    "idelta": (0,),
    "increase": (0,),
    "irate": (0,),
    "label_join": (),
    "label_replace": (),
    "last_over_time": (0,),
    "ln": (),
    "log2": (),
    "max_over_time": (0,),
    "min_over_time": (0,),
    "predict_linear": (0,),
    "quantile_over_time": (1,),
    "rate": (0,),
    "resets": (0,),
    "round": (),
    "scalar": (),
    "sort": (),
    "sort_desc": (),
    "sqrt": (),
    "stddev_over_time": (0,),
    "sum_over_time": (0,),
    "time": (),
    "timestamp": (),
    "vector": (),
}
AGGREGATIONS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "group",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
}
BINARY = ("==", "!=", ">=", "<=", ">", "<", "+", "-", "*", "/", "%", "^")
SET_OPS = ("and", "or", "unless")
COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")
PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    **dict.fromkeys(COMPARISONS, 3),
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
    "^": 6,
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|0[xX][0-9a-fA-F]+
      |(?:[Ii]nf|NaN)(?![a-zA-Z0-9_:]))
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^<>=,(){}\[\]:])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """The expression does not parse."""


@dataclass
class _Token:
    kind: str
    text: str
    at: int


def _tokens(expr: str) -> list[_Token]:
    found = []
    at = 0
    while at < len(expr):
        match = _TOKEN.match(expr, at)
        if match is None:
            raise PromQLError(f"unexpected character {expr[at]!r} at {at}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append(_Token(kind, match.group(), at))
        at = match.end()
    found.append(_Token("end", "", len(expr)))
    return found


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = _tokens(expr)
        self.i = 0
        self.names: set[str] = set()

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self, text: str | None = None, kind: str | None = None) -> _Token:
        token = self.peek
        if (text is not None and token.text != text) or (kind is not None and token.kind != kind):
            wanted = text or kind
            raise PromQLError(f"expected {wanted!r} at {token.at}, found {token.text!r}")
        self.i += 1
        return token

    def accept(self, text: str) -> bool:
        if self.peek.text == text and self.peek.kind in ("op", "ident"):
            self.i += 1
            return True
        return False

    # expr := unary (binop modifiers unary)*, by precedence climbing; returns its type.
    def expression(self, floor: int = 0) -> str:
        kind = self.unary()
        while True:
            op = self.peek.text
            if self.peek.kind not in ("op", "ident") or op not in PRECEDENCE:
                return kind
            level = PRECEDENCE[op]
            if level < floor:
                return kind
            self.i += 1
            if op in COMPARISONS:
                self.accept("bool")
            self.matching()
            right = self.expression(level + (0 if op == "^" else 1))
            if "range" in (kind, right):
                raise PromQLError(f"binary {op!r} on a range vector near {self.peek.at}")
            if op in SET_OPS and "scalar" in (kind, right):
                raise PromQLError(f"{op!r} needs vectors on both sides near {self.peek.at}")
            kind = "scalar" if kind == right == "scalar" else "vector"

    def matching(self) -> None:
        if self.peek.text in ("on", "ignoring"):
            self.i += 1
            self.labels()
        if self.peek.text in ("group_left", "group_right"):
            self.i += 1
            if self.peek.text == "(":
                self.labels()

    def labels(self) -> list[str]:
        self.take("(")
        names = []
        while self.peek.text != ")":
            names.append(self.take(kind="ident").text)
            if not self.accept(","):
                break
        self.take(")")
        return names

    def unary(self) -> str:
        if self.peek.text in ("-", "+") and self.peek.kind == "op":
            self.i += 1
            return self.unary()
        return self.postfix(self.primary())

    def postfix(self, kind: str) -> str:
        while True:
            if self.peek.text == "[":
                self.i += 1
                self.take(kind="duration")
                if self.accept(":"):
                    if self.peek.kind == "duration":
                        self.i += 1
                    if kind not in ("vector", "selector"):
                        raise PromQLError(f"subquery of a {kind} near {self.peek.at}")
                elif kind != "selector":
                    raise PromQLError(f"a range of a {kind} near {self.peek.at}")
                self.take("]")
                kind = "range"
            elif self.peek.text == "offset":
                self.i += 1
                self.accept("-")
                self.take(kind="duration")
            else:
                return "vector" if kind == "selector" else kind

    def primary(self) -> str:
        token = self.peek
        if token.kind == "number":
            self.i += 1
            return "scalar"
        if token.kind == "string":
            self.i += 1
            return "string"
        if token.text == "(":
            self.i += 1
            kind = self.expression()
            self.take(")")
            return "vector" if kind == "selector" else kind
        if token.text == "{":
            self.matchers()
            return "selector"
        if token.kind != "ident" or token.text in KEYWORDS | set(SET_OPS):
            raise PromQLError(f"unexpected {token.text or 'end'!r} at {token.at}")
        self.i += 1
        name = token.text
        if name in AGGREGATIONS:
            return self.aggregation(name)
        if self.peek.text == "(":
            if name not in FUNCTIONS:
                raise PromQLError(f"unknown function {name!r} at {token.at}")
            return self.call(name)
        self.names.add(name)
        if self.peek.text == "{":
            self.matchers()
        return "selector"

    def aggregation(self, name: str) -> str:
        if self.peek.text in ("by", "without"):
            self.i += 1
            self.labels()
        self.take("(")
        if name in ("topk", "bottomk", "quantile", "count_values"):
            self.expression()
            self.take(",")
        if self.expression() == "range":
            raise PromQLError(f"{name} of a range vector near {self.peek.at}")
        self.take(")")
        if self.peek.text in ("by", "without"):
            self.i += 1
            self.labels()
        return "vector"

    def call(self, name: str) -> str:
        self.take("(")
        position = 0
        while self.peek.text != ")":
            kind = self.expression()
            ranged = position in FUNCTIONS[name]
            if ranged != (kind == "range"):
                wanted = "a range vector" if ranged else "no range vector"
                raise PromQLError(f"{name}() argument {position + 1}: {wanted} near {self.peek.at}")
            position += 1
            if not self.accept(","):
                break
        self.take(")")
        return "scalar" if name in ("scalar", "time") else "vector"

    def matchers(self) -> None:
        self.take("{")
        while self.peek.text != "}":
            label = self.take(kind="ident").text
            op = self.take(kind="op").text
            if op not in ("=", "!=", "=~", "!~"):
                raise PromQLError(f"bad matcher operator {op!r} for {label!r}")
            value = self.take(kind="string").text
            if label == "__name__" and op == "=":
                self.names.add(value[1:-1])
            if not self.accept(","):
                break
        self.take("}")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects; raises PromQLError if it does not parse."""
    parser = _Parser(expr)
    parser.expression()
    if parser.peek.kind != "end":
        raise PromQLError(f"unexpected {parser.peek.text!r} at {parser.peek.at}")
    return parser.names
