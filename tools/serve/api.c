// api.c - the OpenAI-compatible JSON of specdec serve: request bodies read
// into an sv_req (with a 400 message naming the field at fault), response
// bodies, stream chunks, errors, and the small endpoints (/v1/models,
// /tokenize, /detokenize; /metrics is metrics.c). Runs in connection
// threads; touches no slot.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/api.h"

// ---------------------------------------------------------------- errors

const char *sv_error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "server_busy";
    case 500: return "server_error";
    default: return "invalid_request_error";
    }
}

char *sv_error_json(int status, const char *code, const char *message) {
    size_t n;
    char *msg = sv_utf8_clean(message, strlen(message), &n);
    json_t *o = json_pack("{s:{s:s, s:s, s:s?}}", "error", "message", msg ? msg : "error", "type",
                          sv_error_type(status), "code", code);
    free(msg);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

// ---------------------------------------------------------------- reading

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

#define BAD(c_, ...) (snprintf(e->msg, sizeof e->msg, __VA_ARGS__), snprintf(e->code, sizeof e->code, "%s", c_), 400)

// Reads optional number field `name` of o into *out within [lo, hi].
// 0 (absent or null: *out untouched, ok), 400 with a message.
static int get_num(const json_t *o, const char *name, double lo, double hi, double *out, sv_api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return BAD("invalid_type", "'%s' must be a number, got %s", name, type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return BAD("invalid_value", "'%s' must be in [%g, %g], got %g", name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_int(const json_t *o, const char *name, long long lo, long long hi, long long *out, sv_api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return BAD("invalid_type", "'%s' must be an integer, got %s", name, type_name(v));
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD("invalid_value", "'%s' must be in [%lld, %lld], got %lld", name, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(const json_t *o, const char *name, int *out, sv_api_err *e) {
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD("invalid_type", "'%s' must be a boolean, got %s", name, type_name(v));
    *out = json_is_true(v);
    return 0;
}

// Parses the body as a JSON object (400 on bad JSON or another type).
json_t *sv_parse_body(const char *body, size_t len, sv_api_err *e) {
    json_error_t je;
    json_t *j = json_loadb(body, len, 0, &je);
    if (!j) {
        (void)BAD("invalid_json", "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    if (!json_is_object(j)) {
        (void)BAD("invalid_type", "the request body must be a JSON object, got %s", type_name(j));
        json_decref(j);
        return NULL;
    }
    return j;
}

// Sampling parameters, max_tokens, stop, stream, speculation, n.
static int parse_params(sv_server *s, const json_t *o, sv_req *r, sv_api_err *e) {
    double x;
    long long k;
    int rc;
    x = r->sp.temp;
    if ((rc = get_num(o, "temperature", 0, 100, &x, e))) return rc;
    r->sp.temp = x < 1e-6 ? 0.0f : (float)x;   // (1 / a subnormal is inf: greedy, as the limit)
    x = r->sp.top_p;
    if ((rc = get_num(o, "top_p", 0, 1, &x, e))) return rc;
    r->sp.top_p = (float)x;
    x = r->sp.min_p;
    if ((rc = get_num(o, "min_p", 0, 1, &x, e))) return rc;
    r->sp.min_p = (float)x;
    x = r->sp.repeat_penalty;
    if ((rc = get_num(o, "repeat_penalty", 0.01, 100, &x, e))) return rc;
    r->sp.repeat_penalty = (float)x;
    k = r->sp.top_k;
    if ((rc = get_int(o, "top_k", 0, 1 << 30, &k, e))) return rc;
    r->sp.top_k = (int)k;
    k = 0;
    if ((rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &k, e))) return rc;
    if (json_is_integer(json_object_get(o, "seed")))
        r->sp.seed = (uint64_t)k;
    else   // a seed of its own per request
        r->sp.seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(size_t)r ^ (uint64_t)s->next_id;
    k = s->o->max_tokens;   // any positive count, clamped to --max-tokens
    if ((rc = get_int(o, "max_completion_tokens", 1, INT64_MAX, &k, e))) return rc;
    if ((rc = get_int(o, "max_tokens", 1, INT64_MAX, &k, e))) return rc;
    r->n_predict = (int)(k < s->o->max_tokens ? k : s->o->max_tokens);
    // log probabilities are not computed: said plainly rather than ignored
    json_t *lp = json_object_get(o, "logprobs"), *tlp = json_object_get(o, "top_logprobs");
    if (lp && !json_is_null(lp) && !json_is_false(lp))
        return BAD("unsupported_parameter", "'logprobs' is not supported by this server (leave it out, or false)");
    if (tlp && !json_is_null(tlp) && !(json_is_integer(tlp) && json_integer_value(tlp) == 0))
        return BAD("unsupported_parameter", "'top_logprobs' is not supported by this server (leave it out)");
    k = 1;
    if ((rc = get_int(o, "n", 1, 1, &k, e))) return rc;
    if ((rc = get_bool(o, "stream", &r->stream, e))) return rc;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BAD("invalid_type", "'stream_options' must be an object, got %s", type_name(so));
        if ((rc = get_bool(so, "include_usage", &r->include_usage, e))) return rc;
    }
    json_t *st = json_object_get(o, "stop");
    if (st && !json_is_null(st)) {
        if (!json_is_string(st) && !json_is_array(st))
            return BAD("invalid_type", "'stop' must be a string or an array of strings, got %s", type_name(st));
        size_t n = json_is_string(st) ? 1 : json_array_size(st);
        if (n > SV_MAX_STOP) return BAD("invalid_value", "'stop' has %zu strings, at most %d", n, SV_MAX_STOP);
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_is_string(st) ? st : json_array_get(st, i);
            if (!json_is_string(v)) return BAD("invalid_type", "'stop[%zu]' must be a string, got %s", i, type_name(v));
            size_t L = json_string_length(v);
            if (L == 0) continue;
            if (L > SV_STOP_MAX_LEN)
                return BAD("invalid_value", "'stop' strings have at most %d bytes, got %zu", SV_STOP_MAX_LEN, L);
            if (!(r->stop[r->n_stop] = strdup(json_string_value(v)))) return BAD("internal", "out of memory");
            r->n_stop++;
        }
    }
    json_t *sp = json_object_get(o, "speculation");
    const char *method = s->def_method.name;
    if (sp && !json_is_null(sp)) {
        if (!json_is_string(sp))
            return BAD("invalid_type", "'speculation' must be a method string or \"off\", got %s", type_name(sp));
        method = json_string_value(sp);
    }
    sd_method m;
    sd_method_plan pl;
    char merr[400];
    if (strlen(method) >= sizeof r->method || sv_method_check(s, method, &m, &pl, merr, sizeof merr) < 0)
        return BAD("invalid_speculation", "'speculation': %s", strlen(method) >= sizeof r->method ? "too long" : merr);
    snprintf(r->method, sizeof r->method, "%s", m.name);
    return 0;
}

// "model" may name any model, as with llama-server: clients often send a
// fixed name; the one model served answers, and replies carry its id.
int sv_check_model(sv_server *s, const json_t *o, sv_api_err *e) {
    (void)s;
    json_t *v = json_object_get(o, "model");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return BAD("invalid_type", "'model' must be a string, got %s", type_name(v));
    return 0;
}

// The text of a message's content: a string, or an array of text parts.
static int message_text(const json_t *c, size_t i, char **out, sv_api_err *e) {
    if (!c || json_is_null(c)) return (*out = strdup("")) ? 0 : BAD("internal", "out of memory");
    if (json_is_string(c)) return (*out = strdup(json_string_value(c))) ? 0 : BAD("internal", "out of memory");
    if (!json_is_array(c))
        return BAD("invalid_type", "'messages[%zu].content' must be a string or an array of text parts, got %s", i,
                   type_name(c));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (sv_buf_add(&buf, &len, &cap, "", 0) < 0) return BAD("internal", "out of memory");
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *p = json_array_get(c, k), *t = json_object_get(p, "text");
        const char *ty = json_string_value(json_object_get(p, "type"));
        if (!json_is_object(p) || !ty || strcmp(ty, "text") || !json_is_string(t)) {
            free(buf);
            return BAD("invalid_value", "'messages[%zu].content[%zu]': only {\"type\": \"text\", \"text\": ...} parts "
                       "are supported", i, k);
        }
        if (sv_buf_add(&buf, &len, &cap, json_string_value(t), json_string_length(t)) < 0) {
            free(buf);
            return BAD("internal", "out of memory");
        }
    }
    *out = buf;
    return 0;
}

// The chat prompt of "messages" in the model's chat template, as ids (*ids,
// *n_ids): the template's markers are special tokens, the contents plain text.
static int chat_prompt(sv_server *s, const json_t *o, int32_t **ids, int *n_ids, sv_api_err *e) {
    json_t *ms = json_object_get(o, "messages");
    if (!ms) return BAD("missing_field", "'messages' is required");
    if (!json_is_array(ms)) return BAD("invalid_type", "'messages' must be an array, got %s", type_name(ms));
    size_t n = json_array_size(ms);
    if (n == 0) return BAD("invalid_value", "'messages' is empty");
    if (n > 4096) return BAD("invalid_value", "'messages' has %zu messages, at most 4096", n);
    const char **roles = calloc(n, sizeof *roles);
    char **contents = calloc(n, sizeof *contents);
    int rc = roles && contents ? 0 : BAD("internal", "out of memory");
    size_t total = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *m = json_array_get(ms, i);
        if (!json_is_object(m)) {
            rc = BAD("invalid_type", "'messages[%zu]' must be an object, got %s", i, type_name(m));
            break;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            rc = BAD("invalid_type", "'messages[%zu].role' must be a string", i);
            break;
        }
        roles[i] = json_string_value(role);
        if ((rc = message_text(json_object_get(m, "content"), i, &contents[i], e))) break;
        total += strlen(contents[i]) + 64;
    }
    char err[256];
    if (rc == 0) {
        int cap = (int)(total < (1u << 24) ? total : (1u << 24)) + 4096, k = -1;
        *ids = malloc(sizeof(int32_t) * (size_t)cap);
        if (*ids) k = sd_chat_tokenize_messages(s->tok, roles, (const char *const *)contents, (int)n, *ids, cap, err,
                                                sizeof err);
        if (!*ids) rc = BAD("internal", "out of memory");
        else if (k < 0) rc = BAD("invalid_value", "'messages': %s", err);
        else if (k > cap) rc = BAD("invalid_value", "the text is too long to tokenize");
        else *n_ids = k;
        if (rc) {
            free(*ids);
            *ids = NULL;
        }
    }
    for (size_t i = 0; contents && i < n; i++) free(contents[i]);
    free(contents);
    free(roles);
    return rc;
}

// Tokenizes text into a new array (*n ids); 0 or 400/500.
int sv_tokenize(sv_server *s, const char *text, int add_bos, int special, int32_t **ids, int *n, sv_api_err *e) {
    size_t len = strlen(text);
    int cap = (int)(len < (1u << 24) ? len : (1u << 24)) + 16;
    *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!*ids) return snprintf(e->msg, sizeof e->msg, "out of memory"), 500;
    *n = sd_tokenize(s->tok, text, len, add_bos, special, *ids, cap);
    if (*n > cap) {   // cannot happen with len + 16 ids, but the contract allows it
        free(*ids);
        *ids = NULL;
        return BAD("invalid_value", "the text is too long to tokenize");
    }
    if (*n < 0) {
        free(*ids);
        *ids = NULL;
        return BAD("invalid_value", "cannot tokenize the text");
    }
    return 0;
}

int sv_parse_generation(sv_server *s, int kind, const json_t *o, sv_req *r, sv_api_err *e) {
    int rc;
    r->kind = kind;
    if ((rc = sv_check_model(s, o, e)) || (rc = parse_params(s, o, r, e))) return rc;
    if (kind == SV_CHAT) {
        if ((rc = chat_prompt(s, o, &r->prompt, &r->n_prompt, e))) return rc;
    } else {   // completions take the prompt as plain text, like specdec generate
        json_t *p = json_object_get(o, "prompt");
        if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
        if (!p) return BAD("missing_field", "'prompt' is required");
        if (!json_is_string(p)) return BAD("invalid_type", "'prompt' must be a string, got %s", type_name(p));
        if ((rc = sv_tokenize(s, json_string_value(p), 1, 0, &r->prompt, &r->n_prompt, e))) return rc;
    }
    if (r->n_prompt == 0) return BAD("invalid_value", "the prompt is empty (no tokens)");
    if (r->n_prompt >= s->n_ctx)
        return BAD("context_length_exceeded", "the prompt has %d tokens but the context per slot is %d (--ctx); "
                   "at least one token must fit after it", r->n_prompt, s->n_ctx);
    long id = atomic_fetch_add(&s->next_id, 1) + 1;
    snprintf(r->id, sizeof r->id, "%s-%ld", kind == SV_CHAT ? "chatcmpl" : "cmpl", id);
    r->created = (long)time(NULL);
    return 0;
}

// ---------------------------------------------------------------- writing

static json_t *usage_json(const sv_req *r) {
    return json_pack("{s:i, s:i, s:i, s:{s:i}, s:{s:s, s:i, s:i, s:i, s:f}, s:f}", "prompt_tokens", r->n_prompt,
                     "completion_tokens", r->n_gen, "total_tokens", r->n_prompt + r->n_gen, "prompt_tokens_details",
                     "cached_tokens", r->n_cached, "speculation", "method", r->method, "drafted", r->n_drafted,
                     "accepted", r->n_accepted, "target_forwards", r->n_forwards, "tau", r->tau, "ttft_ms", r->ttft_ms);
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

char *sv_response_json(sv_server *s, const sv_req *r) {
    size_t n;
    char *text = sv_utf8_clean(r->out ? r->out : "", r->out_len, &n);
    if (!text) return NULL;
    json_t *choice;
    if (r->kind == SV_CHAT)
        choice = json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s}", "index", 0, "message", "role", "assistant", "content",
                           text, n, "logprobs", "finish_reason", r->finish);
    else
        choice = json_pack("{s:i, s:s%, s:n, s:s}", "index", 0, "text", text, n, "logprobs", "finish_reason", r->finish);
    free(text);
    return dump(json_pack("{s:s, s:s, s:I, s:s, s:s, s:[o], s:o}", "id", r->id, "object",
                          r->kind == SV_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)r->created,
                          "model", s->model_id, "system_fingerprint", "specdec-" SPECDEC_VERSION, "choices", choice,
                          "usage", usage_json(r)));
}

// One "data: {...}\n\n" event. delta: text (n bytes) or NULL; first: the
// chat's opening role delta; finish: finish_reason or NULL; usage: 1 adds
// usage to this chunk, 2 makes it the usage-only chunk (empty choices).
static char *chunk(sv_server *s, const sv_req *r, const char *delta, size_t n, int first, const char *finish,
                   int usage, json_t *extra) {
    json_t *choices = json_array();
    if (usage != 2) {
        json_t *c;
        if (r->kind == SV_CHAT) {
            json_t *d = json_object();
            if (first) json_object_set_new(d, "role", json_string("assistant"));
            if (delta || first) json_object_set_new(d, "content", json_stringn(delta ? delta : "", delta ? n : 0));
            c = json_pack("{s:i, s:o, s:n}", "index", 0, "delta", d, "logprobs");
        } else {
            c = json_pack("{s:i, s:s%, s:n}", "index", 0, "text", delta ? delta : "", delta ? n : 0, "logprobs");
        }
        json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
        json_array_append_new(choices, c);
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "id", r->id, "object",
                          r->kind == SV_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                          (json_int_t)r->created, "model", s->model_id, "system_fingerprint", "specdec-" SPECDEC_VERSION,
                          "choices", choices);
    if (o && usage) json_object_set_new(o, "usage", usage_json(r));
    if (o && extra) json_object_set_new(o, "specdec", extra);
    else json_decref(extra);
    char *j = dump(o);
    if (!j) return NULL;
    size_t L = strlen(j);
    char *ev = malloc(L + 9);
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, j, L);
        memcpy(ev + 6 + L, "\n\n", 3);
    }
    free(j);
    return ev;
}

char *sv_chunk(sv_server *s, const sv_req *r, const char *delta, size_t n, int first, const char *finish, int usage) {
    return chunk(s, r, delta, n, first, finish, usage, NULL);
}

// A text chunk of raw[0..n) with how each token came (kind: sv_req.how of
// those bytes): "specdec": {"tokens": [[text, 1 accepted draft / 0 target's
// own], ...], "accepted": A, "target": T}. The text is split where a token
// starts; a token starting inside a character (byte-level tokens) joins the
// piece before it, and a token split over two chunks continues in the next
// one's first piece. A and T count the tokens starting in this chunk, so over a
// stream they add up to usage.speculation.accepted and to the completion
// tokens less the accepted ones (tokens without text are not counted).
// delta.content is the concatenation of the pieces.
char *sv_chunk_spec(sv_server *s, const sv_req *r, const char *raw, const char *kind, size_t n) {
    json_t *toks = json_array();
    char *content = NULL;
    size_t clen = 0, ccap = 0;
    int n_acc = 0, n_tgt = 0, bad = !toks;
    size_t i = 0;
    while (i < n && !bad) {
        size_t j = i + 1;
        while (j < n && !((kind[j] == 'A' || kind[j] == 'T') && ((unsigned char)raw[j] & 0xC0) != 0x80)) {
            if (kind[j] == 'A' || kind[j] == 'T') {   // a token starting inside a character: joins this piece
                if (kind[j] == 'A') n_acc++;
                else n_tgt++;
            }
            j++;
        }
        if (kind[i] == 'A') n_acc++;
        else if (kind[i] == 'T') n_tgt++;
        size_t m;
        char *t = sv_utf8_clean(raw + i, j - i, &m);
        int acc = kind[i] == 'A' || kind[i] == 'a';
        if (!t || sv_buf_add(&content, &clen, &ccap, t, m) < 0 ||
            json_array_append_new(toks, json_pack("[s%, i]", t, m, acc)) < 0)
            bad = 1;
        free(t);
        i = j;
    }
    json_t *extra = bad ? NULL : json_pack("{s:o, s:i, s:i}", "tokens", toks, "accepted", n_acc, "target", n_tgt);
    if (!extra) json_decref(toks);
    char *ev = extra ? chunk(s, r, content ? content : "", clen, 0, NULL, 0, extra) : NULL;
    free(content);
    return ev;
}

char *sv_models_json(sv_server *s) {
    sd_model_info info;
    sd_model_get_info(s->model, &info);
    return dump(json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:{s:i, s:i, s:i, s:s}}]}", "object", "list", "data", "id",
                          s->model_id, "object", "model", "created", (json_int_t)time(NULL), "owned_by", "specdec",
                          "meta", "n_ctx_slot", s->n_ctx, "n_slots", s->n_slots, "n_vocab", info.n_vocab,
                          "speculation", s->def_method.name));
}

// POST /tokenize {"content", "add_special"?: false, "parse_special"?: true} -> {"tokens": [...]}
int sv_tokenize_json(sv_server *s, const json_t *o, char **out, sv_api_err *e) {
    json_t *c = json_object_get(o, "content");
    if (!c) return BAD("missing_field", "'content' is required");
    if (!json_is_string(c)) return BAD("invalid_type", "'content' must be a string, got %s", type_name(c));
    int add_special = 0, parse_special = 1, rc;
    if ((rc = get_bool(o, "add_special", &add_special, e)) || (rc = get_bool(o, "parse_special", &parse_special, e)))
        return rc;
    int32_t *ids;
    int n;
    if ((rc = sv_tokenize(s, json_string_value(c), add_special, parse_special, &ids, &n, e))) return rc;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    *out = dump(json_pack("{s:o}", "tokens", arr));
    return *out ? 0 : (snprintf(e->msg, sizeof e->msg, "out of memory"), 500);
}

// POST /detokenize {"tokens": [...]} -> {"content"} (special tokens rendered,
// so that /tokenize's output round-trips).
int sv_detokenize_json(sv_server *s, const json_t *o, char **out, sv_api_err *e) {
    json_t *t = json_object_get(o, "tokens");
    if (!t) return BAD("missing_field", "'tokens' is required");
    if (!json_is_array(t)) return BAD("invalid_type", "'tokens' must be an array of integers, got %s", type_name(t));
    if (json_array_size(t) > (size_t)SD_MAX(s->n_ctx, 1))
        return BAD("invalid_value", "'tokens' holds %zu ids, more than the context (%d)", json_array_size(t), s->n_ctx);
    int nv = sd_tokenizer_n_vocab(s->tok);
    char *buf = NULL, piece[256];
    size_t len = 0, cap = 0;
    if (sv_buf_add(&buf, &len, &cap, "", 0) < 0) return snprintf(e->msg, sizeof e->msg, "out of memory"), 500;
    for (size_t i = 0; i < json_array_size(t); i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            free(buf);
            return BAD("invalid_value", "'tokens[%zu]' must be a token id in [0, %d), got %s", i, nv,
                       json_is_integer(v) ? "an id outside it" : type_name(v));
        }
        int n = sd_token_to_piece(s->tok, (int32_t)json_integer_value(v), 1, piece, sizeof piece);
        if (n > (int)sizeof piece) n = (int)sizeof piece;
        if (n > 0 && sv_buf_add(&buf, &len, &cap, piece, (size_t)n) < 0) {
            free(buf);
            return snprintf(e->msg, sizeof e->msg, "out of memory"), 500;
        }
    }
    size_t n;
    char *clean = sv_utf8_clean(buf, len, &n);
    free(buf);
    *out = clean ? dump(json_pack("{s:s%}", "content", clean, n)) : NULL;
    free(clean);
    return *out ? 0 : (snprintf(e->msg, sizeof e->msg, "out of memory"), 500);
}
