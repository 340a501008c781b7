"""The shape the production code keeps (issue 35): no function over 50 lines, and the whole
under its line budget, so that growth is a decision, not a drift."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).parent.parent
PRODUCTION = [p for folder in ("egraph_opt", "extractors", "kernels", "rulesets")
              for p in sorted((ROOT / folder).rglob("*.py"))]
LONGEST_FUNCTION, BUDGET = 50, 17_500


def test_no_function_is_longer_than_50_lines():
    long = [f"{p.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for p in PRODUCTION for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > LONGEST_FUNCTION]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def test_production_code_stays_within_its_line_budget():
    lines = sum(len(p.read_text().splitlines()) for p in PRODUCTION)
    assert lines < BUDGET, f"production code is {lines} lines, over its budget of {BUDGET}"
