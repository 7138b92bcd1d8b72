// api.h - the JSON side of specdec serve (api.c): requests read into sv_req,
// responses, stream events, errors and the small endpoints. jansson types
// appear only here and in api.c / http.c.
#ifndef SD_SERVE_API_H
#define SD_SERVE_API_H

#include <jansson.h>

#include "serve/serve.h"

// A client error: the message and OpenAI-style code of a 400 (or other) reply.
typedef struct sv_api_err {
    char msg[512];
    char code[48];
} sv_api_err;

// "invalid_request_error", "authentication_error", ... for an HTTP status.
const char *sv_error_type(int status);
// {"error": {"message", "type", "code"}} (code may be NULL). Caller frees.
char *sv_error_json(int status, const char *code, const char *message);
// The body as a JSON object, or NULL with a 400 message in e.
json_t *sv_parse_body(const char *body, size_t len, sv_api_err *e);
// A "model" field, when present, must be a string (any name: the served model answers): 0 or 400.
int sv_check_model(sv_server *s, const json_t *o, sv_api_err *e);
// Fills r from a /v1/chat/completions (SV_CHAT) or /v1/completions body:
// prompt tokens, sampling, limits, stop strings, speculation. 0, or the
// HTTP status (400) with e filled.
int sv_parse_generation(sv_server *s, int kind, const json_t *o, sv_req *r, sv_api_err *e);
// Tokenizes text into a new array; 0 or an HTTP status with e filled.
int sv_tokenize(sv_server *s, const char *text, int add_bos, int special, int32_t **ids, int *n, sv_api_err *e);
// The non-streaming response of a finished request. Caller frees.
char *sv_response_json(sv_server *s, const sv_req *r);
// One server-sent event "data: {chunk}\n\n" (see api.c). Caller frees.
char *sv_chunk(sv_server *s, const sv_req *r, const char *delta, size_t n, int first, const char *finish, int usage);
// The chat page served at GET / (tools/serve/page.c).
extern const char sv_page_html[];
// A text chunk that also says how each of its tokens came ("specdec" field).
char *sv_chunk_spec(sv_server *s, const sv_req *r, const char *raw, const char *kind, size_t n);
// Bodies of GET /v1/models, GET /metrics, POST /tokenize and /detokenize.
char *sv_models_json(sv_server *s);
char *sv_metrics_text(sv_server *s);
int sv_tokenize_json(sv_server *s, const json_t *o, char **out, sv_api_err *e);
int sv_detokenize_json(sv_server *s, const json_t *o, char **out, sv_api_err *e);

#endif
