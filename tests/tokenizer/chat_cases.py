#!/usr/bin/env python3
"""Chat-template oracle: renders conversations with Python's jinja2, set up
as transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols; tojson = json.dumps(ensure_ascii=
False); raise_exception; strftime_now), and writes one JSON line per case:
{"template": FILE, "context": {...}, "expected": TEXT} or {..., "error": MSG}.

    chat_cases.py TEMPLATE_DIR OUT.jsonl [--seed N --random K]

Without --random: the fixed conversations below (committed as
tests/fixtures/chat_templates/cases.jsonl). With --random K: K random
conversations per template from seed N (the live CI test)."""
import argparse
import datetime
import json
import os
import random
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]

TEXTS = ["Hi there", "What's 2+2?", "  leading and trailing spaces  ", "line one\nline two\n\nline four",
         "Unicode: café, 日本語, 😀 and \"quotes\" and 'single'", "<b>html</b> & {{ not a tag }} {% neither %}",
         "", "tabs\tand\\backslashes\\", "A longer message. " * 5, "1", "Ça va? Привет! مرحبا"]


def fixed_cases():
    s = {"role": "system", "content": "You are a helpful assistant."}
    u = lambda t: {"role": "user", "content": t}
    a = lambda t: {"role": "assistant", "content": t}
    convs = [
        [u("Hello!")],
        [s, u("Hi there"), a("Hello! How can I help?"), u("What's 2+2?")],
        [u("first"), a("second"), u("third"), a("fourth")],
        [s, u(TEXTS[4]), a(TEXTS[3]), u(TEXTS[5])],
        [{"role": "system", "content": "Be brief.\nAlways."}, u(TEXTS[2]), a(TEXTS[7])],
        [u(TEXTS[8]), a(TEXTS[10]), u(TEXTS[9])],
    ]
    out = []
    for i, msgs in enumerate(convs):
        for agp in (True, False):
            out.append({"messages": msgs, "add_generation_prompt": agp, "bos_token": "<s>", "eos_token": "</s>"})
    # tools and tool results
    tool_call = {"role": "assistant", "content": "", "tool_calls": [{"id": "abc123456", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
    tool_res = {"role": "tool", "tool_call_id": "abc123456", "name": "get_weather",
                "content": "{\"temperature\": 21, \"unit\": \"celsius\"}"}
    out.append({"messages": [s, u("What's the weather in Paris?")], "tools": TOOLS,
                "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"})
    out.append({"messages": [s, u("What's the weather in Paris?"), tool_call, tool_res], "tools": TOOLS,
                "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"})
    # roles out of order (some templates raise)
    out.append({"messages": [a("I speak first"), u("ok")], "add_generation_prompt": True,
                "bos_token": "<s>", "eos_token": "</s>"})
    # thinking switches (Qwen3, Granite, Nemotron)
    out.append({"messages": [s, u("Think about it")], "add_generation_prompt": True, "enable_thinking": False,
                "bos_token": "<s>", "eos_token": "</s>"})
    out.append({"messages": [u("q"), {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nanswer"}, u("again")],
                "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"})
    return out


def random_cases(rng, k):
    out = []
    for _ in range(k):
        msgs = []
        if rng.random() < 0.6:
            msgs.append({"role": "system", "content": rng.choice(TEXTS[:6] + ["You are terse."])})
        for t in range(rng.randint(1, 6)):
            msgs.append({"role": "user" if t % 2 == 0 else "assistant",
                         "content": "".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 3)))})
        out.append({"messages": msgs, "add_generation_prompt": rng.random() < 0.7,
                    "bos_token": rng.choice(["<s>", "<|begin_of_text|>", ""]), "eos_token": "</s>"})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random", type=int, default=0)
    args = ap.parse_args()
    env = make_env()
    rng = random.Random(args.seed)
    n = 0
    with open(args.out, "w", encoding="utf-8") as f:
        for name in sorted(os.listdir(args.dir)):
            if not name.endswith(".jinja"):
                continue
            tmpl = env.from_string(open(os.path.join(args.dir, name), encoding="utf-8").read())
            cases = random_cases(rng, args.random) if args.random else fixed_cases()
            for ctx in cases:
                rec = {"template": name, "context": ctx}
                try:
                    rec["expected"] = tmpl.render(**ctx)
                except Exception as e:  # the C renderer must fail too
                    rec["error"] = str(e)
                if not args.random and "expected" in rec:
                    # committed cases must not depend on today's date
                    env.globals["strftime_now"] = lambda fmt: "1999-12-31 " + fmt
                    other = tmpl.render(**ctx)
                    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
                    if other != rec["expected"]:
                        continue
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
    print(f"{n} cases", file=sys.stderr)


if __name__ == "__main__":
    main()
