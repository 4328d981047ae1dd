/* llmem: chat templates -- a Jinja2 subset that renders a conversation into
 * the prompt text a model was trained on.
 *
 * The chat_template of tokenizer_config.json is a Jinja2 template over the
 * variables `messages` (a list of {"role", "content", ...}),
 * `add_generation_prompt`, `bos_token`, `eos_token` and, in some families,
 * `tools`, `documents`, `date_string` and others. This module implements
 * the part of Jinja2 that the chat templates of the families llmem runs
 * use (Llama-2/Mistral, Llama-3, Qwen2/Qwen3, Granite, Nemotron, Falcon-H1,
 * Bamba), with the semantics of Python's `jinja2` (as transformers
 * configures it: trim_blocks and lstrip_blocks on, `raise_exception`,
 * `tojson`, `strftime_now`):
 *
 *   statements  {% if/elif/else/endif %}, {% for x in xs %} / {% for k, v in
 *               d.items() %} with an `if` filter and {% else %},
 *               {% set x = ... %}, {% set ns.x = ... %},
 *               {% macro %} (called as functions; no {% call %}), {% raw %},
 *               {% break %} / {% continue %}, {% generation %},
 *               {# comments #}, whitespace control {%- -%} {{- -}};
 *   expressions literals (strings, ints, floats, true/false/none, lists,
 *               dicts), variables, attribute and item access, slices
 *               ([::-1], [1:]), `+ - * / // % ~`, comparisons, `and or
 *               not`, `in` / `not in`, `is [not] defined/none/string/...`,
 *               `x if c else y`, namespace(...), range(), loop.index,
 *               loop.index0, loop.first, loop.last, loop.length,
 *               loop.previtem/nextitem;
 *   filters     trim, length/count, tojson, default/d, upper, lower, title,
 *               capitalize, first, last, join, replace, string, int, list,
 *               items, reverse, indent, safe, map(attribute=)/selectattr/
 *               rejectattr, select/reject, unique, abs, float;
 *   methods     str.strip/lstrip/rstrip/split/startswith/endswith/upper/
 *               lower/replace/title/capitalize/find, dict.items/keys/values/
 *               get, list.append;
 *   functions   raise_exception(msg), namespace(...), dict(...), range(),
 *               strftime_now(fmt).
 *
 * A template using anything else fails at create time (syntax) or at
 * render time (semantics) with LLMEM_E_UNSUPPORTED and a message naming
 * the construct and its line, e.g. "chat template line 3: filter
 * 'wordwrap' is not supported".
 *
 * A render has a budget: 2 million evaluation steps, 128 MiB of values and
 * 64 MiB of output; nesting is bounded at 100 levels when parsing. A
 * template past them fails (LLMEM_E_INVALID, or LLMEM_E_NO_MEMORY for the
 * values) instead of hanging. Differences from jinja2 that chat templates
 * do not meet: undefined.attr is undefined (jinja2 raises), list.append
 * works (transformers' immutable sandbox refuses it), str() of a float
 * uses the shortest round-trip form as Python does but slices count bytes,
 * not characters.
 *
 * Verified against jinja2 3.1.6 on the Llama-2, Llama-3.1, Llama-3.2,
 * Qwen2.5, Qwen3, Granite 3.3, Nemotron Nano v2 and Mistral Nemo templates
 * (tests/fixtures/chat_templates; fresh random conversations in CI).
 *
 * Threads: a created template is immutable; any number of threads may
 * render it at once.
 *
 * Reference: the Jinja2 template designer documentation
 * (jinja.palletsprojects.com/en/stable/templates); transformers'
 * `apply_chat_template` (utils/chat_template_utils.py) for the environment.
 */
#ifndef LLMEM_CHAT_TEMPLATE_H
#define LLMEM_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "llmem/status.h"

#ifdef __cplusplus
extern "C" {
#endif
LLMEM_API_BEGIN

/* A parsed chat template. Opaque and immutable once created. */
typedef struct llmem_chat_template llmem_chat_template;

/* One chat message. Strings are UTF-8 and NUL-terminated; owned by the
 * caller. */
typedef struct llmem_chat_message {
    const char *role;     /* "system", "user", "assistant", "tool", ... */
    const char *content;  /* the text; NULL renders as none */
} llmem_chat_message;

/* Parses a Jinja2 chat template (`source`, NUL-terminated UTF-8).
 * On success *out owns its own copy of everything; free it with
 * llmem_chat_template_destroy. Returns LLMEM_OK; LLMEM_E_INVALID (NULL
 * arguments, or a syntax error, with the line in err); LLMEM_E_UNSUPPORTED
 * (a statement or construct outside the subset above, named in err);
 * LLMEM_E_NO_MEMORY. */
llmem_status llmem_chat_template_create(const char *source, llmem_chat_template **out,
                                        char *err, size_t err_len);

/* Frees a template. Accepts NULL. */
void llmem_chat_template_destroy(llmem_chat_template *tmpl);

/* Renders `n_msgs` messages. bos_token and eos_token may be NULL (they
 * render as the empty string). On success *out is a malloc'd
 * NUL-terminated string of *out_len bytes (out_len may be NULL); the
 * caller frees it. Returns LLMEM_OK; LLMEM_E_INVALID (NULL arguments, or
 * the template called raise_exception(msg): msg is in err, or a type error
 * such as adding a string to a list); LLMEM_E_UNSUPPORTED (a filter, test,
 * method or function outside the subset, named in err); LLMEM_E_NO_MEMORY.
 */
llmem_status llmem_chat_template_render(const llmem_chat_template *tmpl,
                                        const llmem_chat_message *msgs, size_t n_msgs,
                                        bool add_generation_prompt,
                                        const char *bos_token, const char *eos_token,
                                        char **out, size_t *out_len,
                                        char *err, size_t err_len);

/* Renders with an arbitrary context: `context_json` is a JSON object whose
 * members become the template's variables (e.g. {"messages": [...],
 * "add_generation_prompt": true, "bos_token": "<s>", "tools": [...]}).
 * This is how callers pass tools, documents or extra message fields.
 * Same ownership and statuses as llmem_chat_template_render, plus
 * LLMEM_E_INVALID when context_json is not one JSON object as Python's
 * json.loads reads it (bytes after it, a key given twice, a string holding
 * \u0000 are refused; err says which), and LLMEM_E_NO_MEMORY also when
 * parsing it ran out of memory. */
llmem_status llmem_chat_template_render_json(const llmem_chat_template *tmpl,
                                             const char *context_json,
                                             char **out, size_t *out_len,
                                             char *err, size_t err_len);

LLMEM_API_END
#ifdef __cplusplus
}
#endif
#endif
