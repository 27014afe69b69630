#!/usr/bin/env python3
"""Renders chat templates as Hugging Face transformers' apply_chat_template does.

    chat-template-reference.py TEMPLATES_DIR CASES_JSON > rendered.json

Every `*.jinja` file of TEMPLATES_DIR is rendered with every case of
CASES_JSON (see crates/text/tests/data/chat-template-cases.json), and
each of its `snippets` (named `snippet:NAME`) with its first case. The output
is a JSON list of {"template", "case", "rendered"} or {"template", "case",
"error"}. crates/text/tests/chat_templates.rs runs it in a venv holding only
jinja2 and compares zinfer's rendering with it byte for byte.

The environment is transformers' (`_compile_jinja_template` and
`render_jinja_template` in transformers/utils/chat_template_utils.py),
rewritten here so that transformers itself need not be installed: an
immutable sandbox with trim_blocks and lstrip_blocks, loop controls, a
`{% generation %}` block that only renders its body, a `tojson` filter that
is Python's json.dumps (no HTML escaping), and the `raise_exception` and
`strftime_now` globals. The clock is the fixed time of CASES_JSON
(`now_unix`, read as UTC).

The inputs are shaped as zinfer hands them to its templates, so that the
comparison is of the renderers alone: a message's keys come in the order of
zinfer's ChatMessage fields, and every other mapping (tools, arguments given
as a mapping, extra variables) keeps the order the client gave, as zinfer's
serde_json (with `preserve_order`) and transformers both keep it.
"""

import datetime
import json
import sys
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body unchanged
    (transformers' AssistantTracker when no assistant mask is asked for)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_environment(now):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationBlock, jinja2.ext.loopcontrols],
    )

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


MESSAGE_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content")


def zinfer_message(message):
    """A message as zinfer passes it: its keys in ChatMessage's field order,
    a tool call as {id, type, function: {name, arguments}}."""
    unknown = set(message) - set(MESSAGE_KEYS)
    if unknown:
        raise ValueError(f"a case's message has keys zinfer does not carry: {unknown}")
    out = {}
    for key in MESSAGE_KEYS:
        if key not in message:
            continue
        if key == "tool_calls":
            calls = []
            for call in message[key]:
                shaped = {k: call[k] for k in ("id", "type") if k in call}
                function = call["function"]
                shaped["function"] = {
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
                calls.append(shaped)
            out[key] = calls
        else:
            out[key] = message[key]
    return out


def render(env, source, case, specials):
    template = env.from_string(source)
    variables = dict(specials)
    variables.update(case.get("kwargs", {}))
    tools = case.get("tools")
    return template.render(
        messages=[zinfer_message(m) for m in case["messages"]],
        tools=tools,
        documents=None,
        add_generation_prompt=case.get("add_generation_prompt", True),
        **variables,
    )


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: chat-template-reference.py TEMPLATES_DIR CASES_JSON")
    templates = Path(sys.argv[1])
    cases = json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))
    # Naive, as transformers' datetime.now(); the fixed time is UTC.
    now = datetime.datetime.fromtimestamp(cases["now_unix"], datetime.timezone.utc)
    env = make_environment(now.replace(tzinfo=None))
    specials = {"bos_token": cases["bos_token"], "eos_token": cases["eos_token"]}
    results = []
    for path in sorted(templates.glob("*.jinja")):
        # newline="" keeps "\r\n" as it is in the file, as zinfer reads it.
        with open(path, encoding="utf-8", newline="") as f:
            source = f.read()
        for case in cases["cases"]:
            entry = {"template": path.stem, "case": case["name"]}
            try:
                entry["rendered"] = render(env, source, case, specials)
            except Exception as e:  # every failure is an expected outcome to compare
                entry["error"] = f"{type(e).__name__}: {e}"
            results.append(entry)
    for name, source in cases.get("snippets", {}).items():
        case = cases["cases"][0]
        entry = {"template": f"snippet:{name}", "case": case["name"]}
        try:
            entry["rendered"] = render(env, source, case, specials)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {e}"
        results.append(entry)
    json.dump(results, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
