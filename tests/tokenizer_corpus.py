"""A varied corpus for tokenizer parity: at least 200 strings, deterministic."""
from __future__ import annotations

import random

HANDWRITTEN = [
    "", " ", "  ", "   leading", "trailing   ", "\t", "\t\tindented", "a\tb\tc", "line\nbreak", "\n\n\n",
    "crlf\r\nline\r\n", "\r", " \n \n ", "mixed \t\n whitespace", "Hello world", "Hello  world", "Hello   world!",
    "The quick brown fox jumps over the lazy dog.", "I'm sure you'll see they've gone; it's 'quoted'",
    "DON'T SHOUT", "camelCaseIdentifier", "snake_case_identifier", "kebab-case-words", "UPPER lower MiXeD",
    "0", "7", "42", "123", "1234", "12345678901234567890", "3.14159", "-273.15", "1e-9", "1,000,000", "0x1F",
    "v1.2.3", "2026-11-21", "12:30:45", "$19.99", "100%", "#1 and #2", "x = y + 2*z", "a^2 + b^2 = c^2",
    "https://example.com/path?query=1&b=two#frag", "http://localhost:8080/", "user@example.org",
    "ftp://files.example.net/pub/file.tar.gz", "C:\\Users\\name\\file.txt", "/usr/local/bin/python3",
    "def f(x):\n    return x * 2\n", "for (int i = 0; i < n; i++) { sum += a[i]; }",
    "#include <stdio.h>\nint main(void) { printf(\"hi\\n\"); }", "SELECT * FROM t WHERE id = 3;",
    "{\"key\": [1, 2, {\"nested\": null}]}", "<div class=\"x\">text</div>", "```python\nprint('x')\n```",
    "    four spaces", "        eight spaces", "if x:\n\tpass", "λ x. x", "a → b ⇒ c", "∑ ∫ √ ∞ ≠ ≤",
    "日本語のテキストです。", "中文文本测试，标点符号！", "한국어 문장입니다.", "Привет, мир!", "Ελληνικά γράμματα",
    "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ", "ภาษาไทย", "Tiếng Việt có dấu", "Ünïcödé àçcéñts",
    "naïve café résumé", "ß ẞ ﬁ ﬂ", "🙂", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "❤️ heart", "🇫🇷🇩🇪",
    "emoji🙂inside", "tab\t🙂\tsep", "zero\u200bwidth", "nb\u00a0space", "soft\u00adhyphen", "\u3000ideographic",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHello!<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n", "text<|endoftext|>more text",
    "<|im_start|><|im_end|>", "< |im_start| >", "<|im_start", "<repo_name>kiln<file_sep>main.py",
    "<filename>a.py\n<gh_stars>10", "<jupyter_code>x = 1<jupyter_output>", "<s> </s> <unk>",
    "...", "!!!???", "---", "___", "***bold***", "(parenthesized)", "[bracketed]", "{braced}", "a,b;c:d",
    "'single'", "\"double\"", "`backtick`", "~tilde~", "|pipe|", "back\\slash", "@mention", "&amp;",
]

WORDS = ["the", "model", "cache", "token", "kiln", "Gemma", "llama", "SmolLM2", "über", "日本", "данные", "🙂",
         "3.5", "2048", "x_y", "foo()", "a+b", "it's", "\t", "\n", "  ", "https://a.b/c", "<|im_end|>", "QKV"]


def corpus() -> list[str]:
    rng = random.Random(1234)
    out = list(HANDWRITTEN)
    while len(out) < 240:
        n = rng.randrange(1, 12)
        seps = [" ", " ", " ", "", "\n", "  ", "\t"]
        out.append("".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(n)))
    return out
