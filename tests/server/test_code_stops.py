"""Stop rules for code completion: end of line, end of block, repeating the suffix, streaming."""
from __future__ import annotations

import random

import pytest

from nextok.server.code_stops import CodeStopper, apply_code_stops, default_mode


def multi(text, language, prefix, suffix=""):
    return apply_code_stops(text, "multi_line", language, prefix, suffix)


# ---- single line ------------------------------------------------------------------------------
def test_single_line_ends_at_the_first_newline():
    assert apply_code_stops("foo(x)\n    bar()\n", "single_line", "python", "y = ", "") == "foo(x)"
    assert apply_code_stops("foo(x)\r\nbar", "single_line", "c", "y = ", "") == "foo(x)"
    assert apply_code_stops("foo(x)", "single_line", "c", "y = ", "") == "foo(x)"
    # The cursor at the end of a full line, and the model ends the line at once: nothing.
    assert apply_code_stops("\n    return 1", "single_line", "python", "def f():", "") == ""


def test_default_mode():
    assert default_mode("\nmore") == "multi_line" and default_mode("") == "multi_line"
    assert default_mode("   \r\nmore") == "multi_line"
    assert default_mode(")\nmore") == "single_line"


def test_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        CodeStopper("paragraph", "python", "", "")


# ---- indentation languages --------------------------------------------------------------------
def test_python_stops_at_dedent():
    prefix = "def f(x):\n    "
    text = "y = x + 1\n    return y\n\ndef g():\n    pass\n"
    assert multi(text, "python", prefix) == "y = x + 1\n    return y"


def test_python_block_opened_on_the_cursor_line():
    prefix = "import os\n\ndef f(x):"
    text = "\n    return x\n\nprint(f(1))\n"
    assert multi(text, "python", prefix) == "\n    return x"


def test_python_sibling_statements_continue_the_block():
    prefix = "def f():\n    a = 1\n    "
    text = "b = 2\n    c = 3\n    return a + b + c\nprint(f())\n"
    assert multi(text, "python", prefix) == "b = 2\n    c = 3\n    return a + b + c"


def test_python_else_continues_an_if():
    prefix = "def f(a):\n    if a:"
    text = "\n        b()\n    else:\n        c()\n    return 1\nx = 2\n"
    assert multi(text, "python", prefix) == "\n        b()\n    else:\n        c()"


def test_python_closing_bracket_line_is_not_a_dedent():
    prefix = "def f():\n    return foo(\n        "
    text = "a,\n        b,\n    )\n\nprint(1)\n"
    assert multi(text, "python", prefix) == "a,\n        b,\n    )"


def test_python_new_top_level_definition_at_column_zero():
    prefix = "def f():\n    return 1\n\n"
    text = "def g():\n    return 2\n\ndef h():\n    return 3\n"
    assert multi(text, "python", prefix) == "def g():\n    return 2"


def test_python_stops_at_the_end_of_generation_too():
    prefix = "class A:\n    def f(self):\n        "
    assert multi("return 1\n    def g(self):", "python", prefix) == "return 1"
    assert multi("return 1\n        ", "python", prefix) == "return 1"  # trailing blank dropped


def test_yaml_dedent():
    prefix = "services:\n  web:\n    image: nginx\n    "
    text = "ports:\n      - 80:80\n  db:\n    image: postgres\n"
    assert multi(text, "yaml", prefix) == "ports:\n      - 80:80"


# ---- brace languages --------------------------------------------------------------------------
def test_c_stops_before_the_brace_the_suffix_already_has():
    prefix = "int f(int x) {\n    "
    text = "int y = x + 1;\n    return y;\n}\n\nint g(void) {\n"
    assert multi(text, "c", prefix, "\n}\n") == "int y = x + 1;\n    return y;"


def test_c_keeps_the_closing_brace_when_the_suffix_lacks_it():
    prefix = "int f(int x) {\n    "
    text = "int y = x + 1;\n    return y;\n}\n\nint g(void) {\n"
    assert multi(text, "c", prefix, "") == "int y = x + 1;\n    return y;\n}"


def test_js_inner_blocks_do_not_stop_the_completion():
    prefix = "function f(items) {\n  "
    text = ("for (const x of items) {\n    if (x) {\n      use(x);\n    }\n  }\n  return items;\n"
            "}\nfunction g() {\n")
    assert multi(text, "javascript", prefix, "\n}\n") == (
        "for (const x of items) {\n    if (x) {\n      use(x);\n    }\n  }\n  return items;")


def test_js_callback_close_keeps_its_line():
    prefix = "app.get('/', function (req, res) {\n  "
    text = "res.send('ok');\n});\napp.listen(3000);\n"
    assert multi(text, "javascript", prefix, "") == "res.send('ok');\n});"


def test_braces_in_strings_and_comments_are_ignored():
    prefix = "int main(void) {\n    "
    text = 'printf("}");\n    // }\n    /* } */ char c = \'}\';\n    return 0;\n}\n'
    assert multi(text, "c", prefix, "\n}\n") == (
        'printf("}");\n    // }\n    /* } */ char c = \'}\';\n    return 0;')


def test_a_block_started_by_the_completion_ends_when_closed():
    prefix = "function a() {}\n"
    text = "function b() {\n  return 1;\n}\nfunction c() {\n  return 2;\n}\n"
    assert multi(text, "typescript", prefix, "") == "function b() {\n  return 1;\n}"


def test_rust_lifetimes_do_not_open_strings():
    prefix = "impl S {\n    "
    text = "fn get<'a>(&'a self) -> &'a str {\n        &self.name\n    }\n}\n"
    assert multi(text, "rust", prefix, "\n}\n") == (
        "fn get<'a>(&'a self) -> &'a str {\n        &self.name\n    }")


def test_go_mid_line_close_with_suffix():
    prefix = "func f() {\n\t"
    assert multi("x := 1; }\n", "go", prefix, "\n}") == "x := 1;"


# ---- repeating the suffix ---------------------------------------------------------------------
def test_stops_where_the_completion_repeats_the_suffix():
    # The cursor at the start of the line "z = 3": the cut keeps the line break.
    assert multi("y = 2\nz = 3\nw = 4\n", "python", "x = 1\n", "z = 3\n") == "y = 2\n"
    # The cursor at the end of a line: the suffix brings the line break.
    assert multi("\nq = 0\nz = 3\n", "python", "x = 1\ny = 2", "\n\nz = 3\n") == "\nq = 0"
    assert multi("const b = 2;\nconst c = 3;\n", "javascript", "const a = 1;\n",
                 "\nconst c = 3;\n") == "const b = 2;"


def test_repeat_keeps_the_indentation_the_suffix_lacks():
    prefix = "def f():\n    "  # the cursor sits before existing code on its line
    text = "y = 2\n    return x\n"
    assert multi(text, "python", prefix, "return x\n") == "y = 2\n    "
    assert multi("return x\n", "python", prefix, "return x\n") == ""


def test_punctuation_only_suffix_lines_are_not_repeats():
    prefix = "if (a) {\n  "
    text = "if (b) {\n    c();\n  }\n  d();\n}\nmore();\n"
    assert multi(text, "c", prefix, "\n}\n") == "if (b) {\n    c();\n  }\n  d();"


def test_unknown_language_only_uses_the_repeat_rule():
    prefix = "SELECT a\n"
    assert multi("FROM t\nWHERE x = 1\nORDER BY a;\n", "sql", prefix, "ORDER BY a;\n") == (
        "FROM t\nWHERE x = 1\n")


# ---- streaming --------------------------------------------------------------------------------
CASES = [
    ("multi_line", "python", "def f(x):\n    ", "", "y = x + 1\n    return y\n\ndef g():\n    pass\n"),
    ("multi_line", "python", "def f(a):\n    if a:", "",
     "\n        b()\n    else:\n        c()\n    return 1\nx = 2\n"),
    ("multi_line", "c", "int f(int x) {\n    ", "\n}\n",
     "int y = x + 1;\n    return y;\n}\n\nint g(void) {\n"),
    ("multi_line", "c", "int f(int x) {\n    ", "", "int y = 1;\r\n    return y;\r\n}\r\nint z;\r\n"),
    ("multi_line", "javascript", "const a = 1;\n", "\nconst c = 3;\n",
     "const b = 2;\nconst c = 3;\nconst d = 4;\n"),
    ("multi_line", "python", "x = 1\n", "", "y = 2\nz = 3\n"),
    ("single_line", "python", "x = ", "", "foo(1)\nbar(2)\n"),
]


@pytest.mark.parametrize("case", CASES)
def test_streaming_in_random_chunks_gives_the_same_cut(case):
    mode, lang, prefix, suffix, text = case
    whole = apply_code_stops(text, mode, lang, prefix, suffix)
    rng = random.Random(0)
    for _ in range(30):
        stopper = CodeStopper(mode, lang, prefix, suffix)
        pos, cut = 0, None
        while pos < len(text) and cut is None:
            pos = min(len(text), pos + rng.randint(1, 5))
            cut = stopper.feed(text[:pos])
            # What is safe to stream is never taken back by the final cut.
            assert stopper.safe_length(text[:pos]) <= len(whole)
            assert text[:stopper.safe_length(text[:pos])] == whole[:stopper.safe_length(text[:pos])]
        assert stopper.finish(text[:pos]) == whole
        if cut is not None:  # the stop came from a complete line: later text changes nothing
            assert stopper.feed(text) == cut


def test_feed_waits_for_complete_lines():
    stopper = CodeStopper("multi_line", "python", "def f():\n    ", "")
    assert stopper.feed("return 1\ndef g") is None  # "def g" may still become "def g():"...
    assert stopper.feed("return 1\ndef g():\n") == len("return 1")
    assert stopper.final_cut("return 1\ndef g():\n") == len("return 1")


def test_language_from_the_file_extension():
    prefix = "int f(int x) {\n    "
    text = "return x;\n}\nint g;\n"
    assert apply_code_stops(text, "multi_line", "", prefix, "\n}\n", "a/b.c") == "return x;"
    assert apply_code_stops(text, "multi_line", "", prefix, "\n}\n") == text.rstrip()


def test_python_code_below_the_typed_indentation_ends_it():
    # The cursor sits on "    " inside fib(); the model ends the line and writes top-level code.
    prefix = "def fib(n):\n    if n < 2:\n        return n\n    "
    text = "\n# Test the function\nprint(fib(10))\n"
    assert apply_code_stops(text, "multi_line", "python", prefix, "\n") == ""
    kept = "\n    return fib(n - 1) + fib(n - 2)\nprint(fib(10))\n"
    assert apply_code_stops(kept, "multi_line", "python", prefix, "\n") == "\n    return fib(n - 1) + fib(n - 2)"
