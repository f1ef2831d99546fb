#!/usr/bin/python3
"""Writes vectors.json: chat-template renderings by the two reference implementations.

`expected` comes from Python's jinja2 configured exactly as Hugging Face transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
its tojson and raise_exception); `hf_js` from Hugging Face's JavaScript Jinja
(@huggingface/jinja), recorded for comparison. Run at test-preparation time only:
  (cd /tmp && npm install @huggingface/jinja)
  NODE_PATH=/tmp/node_modules /usr/bin/python3 tests/data/chat_templates/make_vectors.py
"""
import json
import os
import subprocess

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "../../.."))


def hf_environment():
    # transformers/utils/chat_template_utils.py: _compile_jinja_template
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def from_config(name):
    path = os.path.join(ROOT, "tests/data/tokenizers", name, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)["chat_template"]


with open(os.path.join(HERE, "builtin_templates.json"), encoding="utf-8") as f:
    BUILTINS = json.load(f)

TEMPLATES = {
    "llama-2": BUILTINS["llama-2"],
    "llama-3": BUILTINS["llama-3"],
    "chatml": BUILTINS["chatml"],
    "tokenizer:llama3": from_config("llama3"),
    "tokenizer:qwen3": from_config("qwen3"),
}
# Templates of families whose tokenizer is not bundled (family_templates.json names the sources).
with open(os.path.join(HERE, "family_templates.json"), encoding="utf-8") as f:
    for name, source in json.load(f).items():
        if not name.startswith("_"):
            TEMPLATES["family:" + name] = source

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello there!"}],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "  What is 2+2?\n"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a story about a cat named \u00c9mile \U0001f408."},
    ],
    "no_system_turns": [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": " two "},
        {"role": "user", "content": "three"},
    ],
    "thinking": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nreasoning here\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
    ],
    "bad_alternation": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ],
}

SNIPPETS = [
    "{{ 'a' + 'b' }}|{{ 7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ 1 ~ 2 }}",
    "{% for x in [3, 1, 2] %}{{ loop.index }}:{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for x in [1,2,3,4] if x is even %}{{ x }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{{ ns.n }}",
    "{{ messages | length }}|{{ messages[0].role | upper }}|{{ messages[-1]['content'] }}",
    "{{ messages[1:] | map(attribute='role') | join(',') }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
    "{{ 'Hello World'.split(' ')[1].lower() }}|{{ '  x  '.strip() }}|{{ 'abc'[::-1] }}",
    "{{ 'a' if false else 'b' }}|{{ none is none }}|{{ undefined_var is defined }}",
    "{{ {'k': 'v', 'n': [1, 2.5, true, none]} | tojson }}",
    "{{ messages[0] | tojson }}",
    "{{ 'x' * 3 }}|{{ [1, 2] + [3] }}|{{ 'ab' in 'cabd' }}|{{ 3 not in [1, 2] }}",
    "{%- macro greet(name, punct='!') -%}Hi {{ name }}{{ punct }}{%- endmacro -%}"
    "{{ greet('Ann') }} {{ greet('Bo', '?') }}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}",
    "  {%- if true %}\n  yes\n  {%- endif %}\n",
    "{% if true %}\nline\n{% endif %}\nend",
    "{{ 'title case words' | title }}|{{ 'cap' | capitalize }}|{{ 'a-b-c' | replace('-', '+') }}",
    "{{ range(3) | list }}|{{ range(1, 7, 2) | list }}|{{ [3, 1, 2] | sort }}",
    "{{ 'x' | default('d') }}|{{ missing | default('d') }}|{{ [1, 2, 3] | first }}"
    "{{ [1, 2, 3] | last }}",
    "{{ raise_exception('boom') }}",
    "{{ 10 / 4 }}|{{ -3 // 2 }}|{{ 1.5 + 1 }}|{{ true and false or true }}",
    "{% for m in messages %}{% if loop.first %}[{% endif %}{{ loop.index0 }}"
    "{% if loop.last %}]{% endif %}{% endfor %}",
    "{{ messages[0].content.startswith('You') }}|{{ 'abc'.endswith('c') }}|{{ 'a,b'.split(',') }}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
    "{% endif %}{{ i }}{% endfor %}",
    "{{ messages[0]['content'] | trim | length }}|{{ 'a\\nb' | indent(2) }}|{{ [1, 2, 3] | sum }}",
    "{% for k, v in {'b': 1, 'a': 2} | dictsort %}{{ k }}{{ v }}{% endfor %}|{{ 'AbC' | lower }}",
    "{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]",
    "{{ 3 > 2 and 2 >= 2 and 1 < 2 and 1 <= 1 and 1 != 2 }}|{{ not none }}|{{ 'a' < 'b' }}",
    # The source's newlines ("\r\n", "\r") become "\n"; one at the very end is dropped.
    "{{ 'a' }}\r\nb\rc\n\n",
    "{% if true %}\n### Response:\n{% endif %}\n",
    "{% raw %}{{ not evaluated }}{% if %}{% endraw %}|  {%- raw -%}  x  {%- endraw -%}  |",
    # {% call %} blocks: caller() with and without arguments, rendered with the call site's
    # names, not the macro's.
    "{%- macro box(title) -%}[{{ title }}:{{ caller() }}]{%- endmacro -%}"
    "{% call box('t') %}body {{ messages | length }}{% endcall %}",
    "{% macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}"
    "{% call(item, n) each(['a', 'b']) %}{{ n }}={{ item }};{% endcall %}",
    "{% macro m(x) %}{% set y = 'macro' %}{{ caller() }}{{ y }}{% endmacro %}{% set y = 'site' %}"
    "{% call m(1) %}{{ y }}{% endcall %}",
    "{% filter upper %}hello {{ 'x' }}{% endfilter %}|"
    "{% filter replace('a', 'o') | title %}banana bread{% endfilter %}",
    # Arguments spread from a list (*) and a mapping (**); the rest in varargs and kwargs.
    "{% macro mul(a, b, c=1) %}{{ a * b * c }}{% endmacro %}{{ mul(*[2, 3]) }}|"
    "{{ mul(*[2, 3], **{'c': 4}) }}|{% set fs = [mul] %}{{ fs[0](*[1, 2, 3]) }}",
    "{% macro m(a) %}{{ a }}{{ varargs | length }}{{ varargs[1] }}{{ kwargs.k }}{% endmacro %}"
    "{{ m(1, 2, 3, k='v') }}",
    # tojson's options (Hugging Face's tojson: ensure_ascii, indent, separators, sort_keys).
    "{{ {'b': [1, 2], 'a': '\u00e9\U0001f917'} | tojson(separators=(',', ':')) }}|"
    "{{ {'b': 1, 'a': {'d': 2, 'c': 3}} | tojson(sort_keys=true) }}|"
    "{{ '\u00e9\U0001f917\x07' | tojson(ensure_ascii=true) }}",
    "{{ [1, {'a': []}] | tojson(indent=2) }}|{{ [1, 2] | tojson(indent='\t') }}|"
    "{{ [1, [2]] | tojson(indent=0) }}|{{ {'a': 1} | tojson(indent=2, separators=(';', '=')) }}",
    # indent: blank lines stay blank unless blank=true, a trailing line end is not indented.
    "{{ '{\n' | indent(4, first=True) }}|{{ 'a\n\nb\n' | indent(2) }}|"
    "{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'a\r\nb' | indent('> ', true) }}",
    "{% for k, v in {'b': 1, 'a': 3, 'C': 2} | dictsort %}{{ k }}{% endfor %}|"
    "{% for k, v in {'b': 1, 'a': 3, 'C': 2} | dictsort(true) %}{{ k }}{% endfor %}|"
    "{% for k, v in {'b': 1, 'a': 3, 'C': 2} | dictsort(by='value', reverse=true) %}{{ k }}"
    "{% endfor %}",
    "{{ [{'n': 'b', 'p': {'x': 2}}, {'n': 'a', 'p': {'x': 1}}, {'n': 'c', 'p': {'x': 2}}] | "
    "sort(attribute='p.x', reverse=true) | map(attribute='n') | join }}|"
    "{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|"
    "{{ [{'a': 2, 'b': 'y'}, {'a': 1, 'b': 'z'}, {'a': 2, 'b': 'x'}] | sort(attribute='a,b') | "
    "map(attribute='b') | join }}|{{ [none, none] | sort }}",
    "{{ ['a', 'A', 'b'] | unique | list }}|{{ [{'u': {'n': 1}}, {'u': {'n': 2}}] | "
    "map(attribute='u.n') | list }}|{{ none | selectattr('type', 'equalto', 'x') | list }}|"
    "{{ [[1, 2], [3, 4]] | map(attribute='1') | list }}",
    "{{ '42' | int }}|{{ ' 7 ' | int }}|{{ '4.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(-1) }}|"
    "{{ '1_000' | int }}|{{ 'ff' | int(base=16) }}|{{ true | int }}|{{ 2.9 | int }}|"
    "{{ '2.5' | float }}|{{ 'x' | float }}|{{ 'x' | float(1.5) }}|{{ 3 | float }}",
    "{{ ' a b  c '.split(none, 1) }}|{{ 'a b'.split() }}|{{ 'a,b,c'.split(',', 1) }}|"
    "{{ -true }}|{{ +false }}|{{ -0.0 }}|{{ messages.0.role }}|{{ messages.1.content.2 }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set (c, d) = [3, 4] %}{{ c }}{{ d }}|"
    "{% for (k, v) in [[5, 6]] %}{{ k }}{{ v }}{% endfor %}",
    "{{ '\u00c0\u00c9 \u03a3\u0391\u03a3' | lower }}|{{ undefined_x is callable }}|"
    "{{ undefined_x is iterable }}|{{ 1 is iterable }}",
    # Dict keys that are not strings (ByteDance Seed-OSS maps token budgets to intervals).
    "{%- set d = {1024: 256, 0: 0, 512: 128} -%}{% for k, v in d | dictsort %}{{ k + 1 }}={{ v }};"
    "{% endfor %}|{{ d[512] }}|{{ 512 in d }}|{{ 7 in d }}|{% set e = {'k': none, 2: 'two', 1.5: "
    "true, none: 0} %}{{ e }}|{{ e | tojson }}|{{ e.keys() | list }}|{{ e[2] }}{{ e[none] }}",
    "{{ 2.5 | round }}|{{ 3.5 | round }}|{{ 5 | round }}|{{ 2.675 | round(2) }}|"
    "{{ 2.5 | round(0, 'floor') }}|{{ 2.1 | round(0, 'ceil') }}|{{ 1234.5 | round(-2) }}|"
    "{{ [{'x': 1}, {'x': 5}] | max(attribute='x') }}|{{ ['b', 'A'] | min }}|"
    "{{ [{'x': 1}, {'x': 5}] | sum(attribute='x') }}|{{ [[1], [2]] | sum(start=[0]) }}",
    "{{ 'abcabc'.rfind('b') }}|{{ 'abc'.index('c') }}|{{ 'a,b,c'.rsplit(',', 1) }}|"
    "{{ ' a  b '.rsplit(none, 1) }}|{{ 'a\nb\r\nc'.splitlines() }}|{{ '7'.zfill(3) }}|"
    "{{ '-7'.zfill(4) }}|{{ 'a'.ljust(3, '*') }}|{{ 'a'.rjust(3) }}|{{ 'ab'.center(5) }}|"
    "{{ 'abc'.center(6, '.') }}|{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}"
    "{{ 'ab1'.islower() }}{{ 'AB'.isupper() }}{{ ''.isalnum() }}|{{ 'a=b=c'.partition('=')[2] }}|"
    "{{ 'x.py'.removesuffix('.py') }}|{{ {'a': 1}.copy() }}|{{ [1, 2, 2].count(2) }}|"
    "{{ [1, 2, 3].index(2) }}|{{ {'a': 1}.get('b', 'd') }}",
    "{% with a = 1, b = messages | length %}{{ a }}{{ b }}{% endwith %}{{ a is defined }}|"
    "{% for x in range(5) %}{{ loop.cycle('o', 'e') }}{% endfor %}|{{ 0x1f }}{{ 0o17 }}{{ 0b101 }}|"
    "{{ 1 is in [1, 2] }}|{{ 'a' is in {'a': 1} }}|{{ () | length }}",
    # String formatting: printf-style (the % operator and the format filter) and str.format.
    "{{ '%s-%05.1f|%x|%#o|%-4s|%.2s|%r|%c|%%|%+d' % ('a', 3.14159, 255, 15, 'ab', 'abc', 'q', 65, "
    "5) }}|{{ '%(a)s:%(b)03d' % {'a': 'x', 'b': 7} }}|{{ '%*d|%.*f' % (4, 42, 2, 2.71828) }}|"
    "{{ '%s' % {'k': 1} }}|{{ '%s=%s' | format('n', 1) }}|{{ '%(x)s' | format(x=5) }}",
    "{{ 'x{}y{k}{0}'.format(1, k=2) }}|{{ '{:>5}|{:<5}|{:*^7}'.format('ab', 'ab', 'ab') }}|"
    "{{ '{:05d}|{:+d}|{:,}|{:#x}|{:b}|{:=+8d}'.format(42, 42, 1234567, 255, 5, 42) }}|"
    "{{ '{:.2f}|{:8.3f}|{:.1%}|{}|{:,.2f}'.format(3.14159, 2.5, 0.256, 1.5, 1234567.891) }}|"
    "{{ '{a[1]}|{b.c}|{{}}|{x!r}'.format(a=[1, 2], b={'c': 3}, x='q') }}",
    "{{ [1, 2, 3, 4, 5] | batch(2) | list }}|{{ [1, 2, 3] | batch(2, 'x') | list }}|"
    "{{ [1, 2, 3, 4, 5] | slice(3) | list }}|{{ [1, 2, 3, 4] | slice(3, 0) | list }}|"
    "{{ 'a b  c_d 1' | wordcount }}|{{ 'hello world foo' | truncate(9) }}|"
    "{{ 'hello world foo' | truncate(9, true) }}|{{ 'ab' | center(6) }}|",
    "{% for g in [{'a': 1, 'b': 2}, {'a': 2, 'b': 4}, {'a': 1, 'b': 3}] | groupby('a') %}"
    "{{ g.grouper }}:{{ g.list | map(attribute='b') | join(',') }};{% endfor %}|{% for k, items in "
    "[{'c': 'X'}, {'c': 'x'}, {'c': 'y'}] | groupby('c') %}{{ k }}={{ items | length }};{% endfor %}",
    # Recursive loops: loop(items) runs the body again, one level deeper, the filter included.
    "{% set tree = [{'t': 'a', 'c': [{'t': 'b', 'c': [{'t': 'c'}]}, {'t': 'd'}]}, {'t': 'e'}] %}"
    "{% for n in tree recursive %}[{{ loop.depth }}{{ n.t }}{% if n.c %}{{ loop(n.c) }}{% endif %}]"
    "{% endfor %}|{% for n in tree if n.t != 'd' recursive %}{{ loop.depth0 }}{{ n.t }}"
    "{{ loop.index }}{% if n.c %}({{ loop(n.c) }}){% endif %}{% endfor %}",
    # Case mappings: Jinja's title filter (word starts after - space ( { [ <), str.title,
    # capitalize, full Unicode upper/lower (straße -> STRASSE, final sigma), Unicode whitespace.
    "{{ \"don't stop-me now(x) o'neil\" | title }}|{{ \"don't stop\".title() }}|"
    "{{ 'hELLO wORLD' | capitalize }}|{{ '\u00e9cole \u00c9T\u00c9 stra\u00dfe \u01c6emal' | title }}|"
    "{{ 'stra\u00dfe' | upper }}|{{ '\u03a3\u0391\u03a3 \u03a3\u0391\u03a3' | capitalize }}|"
    "{{ '\ufb01ne' | upper }}|{{ 'Ab\u00c9'.swapcase() }}|{{ '\u00e9' is lower }}|"
    "{{ '\u3000a\u00a0'.strip() }}|{{ 'a\u2003b'.split() }}",
]


def main():
    env = hf_environment()
    cases = []
    for tname, source in TEMPLATES.items():
        llama3 = "llama3" in tname or tname == "llama-3"
        phi = tname.startswith("family:phi")
        gemma = tname.startswith("family:gemma")
        for cname, messages in CONVERSATIONS.items():
            for add_gen in (False, True):
                variables = {
                    "messages": messages,
                    "add_generation_prompt": add_gen,
                    "bos_token": "<|begin_of_text|>" if llama3 else "<bos>" if gemma else "<s>",
                    "eos_token": ("<|eot_id|>" if llama3 else "<|endoftext|>" if phi else
                                  "<eos>" if gemma else "</s>"),
                }
                cases.append({"template": tname, "source": source,
                              "name": f"{tname}/{cname}/gen={add_gen}", "variables": variables})
    # Qwen3's thinking switch (apply_chat_template(..., enable_thinking=...)): false closes an
    # empty think block after the generation prompt; true and absent leave it open.
    for cname in ("user", "thinking", "multi_turn"):
        for thinking in (False, True):
            variables = {"messages": CONVERSATIONS[cname], "add_generation_prompt": True,
                         "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": thinking}
            cases.append({"template": "tokenizer:qwen3", "source": TEMPLATES["tokenizer:qwen3"],
                          "name": f"tokenizer:qwen3/{cname}/gen=True/enable_thinking={thinking}",
                          "variables": variables})
    for i, source in enumerate(SNIPPETS):
        cases.append({"template": "inline", "source": source, "name": f"snippet{i}",
                      "variables": {"messages": CONVERSATIONS["system_user"]}})
    for c in cases:
        try:
            c["expected"] = env.from_string(c["source"]).render(**c["variables"])
        except Exception as e:  # noqa: BLE001 - any failure of the reference is a vector
            c["error"] = str(e)
    js = json.loads(subprocess.run(
        ["node", os.path.join(HERE, "render_js.mjs")], check=True, capture_output=True,
        input=json.dumps([{"source": c["source"], "variables": c["variables"]} for c in cases]),
        text=True).stdout)
    for c, r in zip(cases, js):
        c["hf_js"] = r.get("expected", "error: " + r.get("error", ""))
        if c["template"] != "inline":
            del c["source"]  # the test takes it from the template name
    with open(os.path.join(HERE, "vectors.json"), "w", encoding="utf-8") as f:
        json.dump({"generator": f"jinja2 {jinja2.__version__} (transformers' environment); "
                                "hf_js: @huggingface/jinja", "cases": cases},
                  f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
