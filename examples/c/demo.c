/* The vkllm C API from C.
 *
 *   demo ids MODEL 1,2,3 N     greedy N ids after a prompt of ids
 *   demo chat MODEL QUESTION   chat template, tokenize, stream a reply, two turns
 *   demo batch MODEL 1,2,3 N   three sequences decoded together, each against its run alone
 *   demo json MODEL SCHEMA Q   a reply valid against a JSON schema (structured output)
 *   demo error MODEL           what a failed load reports
 *
 * Build: cargo build --release, then
 *   cc -std=c99 -I. examples/c/demo.c -Ltarget/release -Wl,-rpath,$PWD/target/release -lvkllm
 */
#include "vkllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, vkllm_status s) {
    fprintf(stderr, "%s: status %d: %s\n", what, (int)s, vkllm_last_error());
    return 1;
}

static vkllm_model *load_for(const char *path, uint32_t sequences) {
    vkllm_load_options opts = vkllm_default_load_options();
    opts.backend = "cpu";
    opts.context = 512;
    opts.sequences = sequences;
    vkllm_model *m = NULL;
    vkllm_status s = vkllm_model_load(path, &opts, &m);
    if (s != VKLLM_STATUS_OK) {
        fail("load", s);
        return NULL;
    }
    return m;
}

static vkllm_model *load(const char *path) { return load_for(path, 0); }

static int ids(const char *path, char *list, int n) {
    uint32_t prompt[256];
    size_t len = 0;
    for (char *t = strtok(list, ","); t && len < 256; t = strtok(NULL, ","))
        prompt[len++] = (uint32_t)strtoul(t, NULL, 10);
    vkllm_model *m = load(path);
    if (!m) return 1;
    vkllm_status s = vkllm_eval(m, prompt, len);
    for (int i = 0; s == VKLLM_STATUS_OK && i < n; i++) {
        uint32_t next;
        s = vkllm_greedy(m, &next);
        if (s != VKLLM_STATUS_OK) break;
        printf(i ? ",%u" : "%u", next);
        s = vkllm_eval(m, &next, 1);
    }
    printf("\n");
    vkllm_model_free(m);
    return s == VKLLM_STATUS_OK ? 0 : fail("generate", s);
}

/* What the stream callback collects. */
struct reply {
    char text[4096];
    size_t len;
    uint32_t ids[256];
    size_t n_ids;
};

static bool on_token(uint32_t token, const char *text, size_t len, void *user) {
    struct reply *r = user;
    if (r->n_ids < 256) r->ids[r->n_ids++] = token;
    if (r->len + len < sizeof r->text) {
        memcpy(r->text + r->len, text, len);
        r->len += len;
        r->text[r->len] = 0;
    }
    fwrite(text, 1, len, stderr); /* streamed as it comes */
    return true;
}

/* One assistant turn after `msgs`: template, tokenize, generate. */
static int turn(vkllm_model *m, const vkllm_chat_message *msgs, size_t n, struct reply *r) {
    char prompt[8192];
    size_t len;
    vkllm_status s = vkllm_apply_chat_template(m, msgs, n, true, prompt, sizeof prompt, &len);
    if (s != VKLLM_STATUS_OK) return fail("chat template", s);
    printf("prompt: %s\n", prompt);
    uint32_t ids[2048];
    size_t n_ids;
    s = vkllm_tokenize(m, prompt, false, ids, 2048, &n_ids);
    if (s != VKLLM_STATUS_OK) return fail("tokenize", s);
    vkllm_generate_options opts = vkllm_default_generate_options();
    opts.max_tokens = 48;
    opts.sampling.temperature = 0; /* greedy */
    memset(r, 0, sizeof *r);
    size_t generated;
    vkllm_stop why;
    s = vkllm_generate(m, ids, n_ids, &opts, on_token, r, &generated, &why);
    if (s != VKLLM_STATUS_OK) return fail("generate", s);
    fprintf(stderr, "\n");
    printf("reply: %s\n", r->text);
    printf("%zu tokens, stop %d\n", generated, (int)why);
    return 0;
}

static int chat(const char *path, const char *question) {
    vkllm_model *m = load(path);
    if (!m) return 1;
    struct reply r;
    vkllm_chat_message msgs[3] = {{"user", question}, {"assistant", ""}, {"user", "And of Germany?"}};
    int rc = turn(m, msgs, 1, &r);
    if (rc == 0) {
        /* The ids, less a final stop token, decode to the streamed text. */
        size_t n = r.n_ids;
        if (n && vkllm_is_stop(m, r.ids[n - 1])) n--;
        char text[4096];
        size_t len;
        vkllm_status s = vkllm_detokenize(m, r.ids, n, text, sizeof text, &len);
        if (s != VKLLM_STATUS_OK) rc = fail("detokenize", s);
        else if (strcmp(text, r.text) == 0) printf("streamed == detokenized\n");
        /* A too-small buffer says how much is needed. */
        char tiny[2];
        s = vkllm_detokenize(m, r.ids, n, tiny, sizeof tiny, &len);
        printf("small buffer: status %d, needs %zu bytes\n", (int)s, len);
    }
    if (rc == 0) {
        /* Second turn: the whole conversation again; the cached first turn is reused. */
        static char first[4096];
        strcpy(first, r.text);
        msgs[1].content = first;
        rc = turn(m, msgs, 3, &r);
    }
    vkllm_model_free(m);
    return rc;
}

/* Three prompts (the ids, without the first, with the first again at the
 * end) decoded together for n ids; each compared with its run alone on the
 * handle's own sequence. */
static int batch(const char *path, char *list, int n) {
    uint32_t prompts[3][257];
    size_t lens[3] = {0, 0, 0};
    for (char *t = strtok(list, ","); t && lens[0] < 256; t = strtok(NULL, ","))
        prompts[0][lens[0]++] = (uint32_t)strtoul(t, NULL, 10);
    if (lens[0] < 2 || n < 1 || n > 64) {
        fprintf(stderr, "batch needs 2 to 256 ids and 1 to 64 steps\n");
        return 2;
    }
    lens[1] = lens[0] - 1;
    memcpy(prompts[1], prompts[0] + 1, lens[1] * sizeof(uint32_t));
    lens[2] = lens[0] + 1;
    memcpy(prompts[2], prompts[0], lens[0] * sizeof(uint32_t));
    prompts[2][lens[0]] = prompts[0][0];
    vkllm_model *m = load_for(path, 3);
    if (!m) return 1;
    uint64_t seqs[3];
    uint32_t out[3][64], next[3];
    vkllm_status s = VKLLM_STATUS_OK;
    for (int i = 0; s == VKLLM_STATUS_OK && i < 3; i++) {
        size_t reused;
        s = vkllm_seq_add(m, prompts[i], lens[i], &seqs[i], &reused);
        if (s == VKLLM_STATUS_OK)
            s = vkllm_seq_eval(m, seqs[i], prompts[i] + reused, lens[i] - reused, &out[i][0], NULL);
    }
    for (int step = 1; s == VKLLM_STATUS_OK && step < n; step++) {
        uint32_t fed[3] = {out[0][step - 1], out[1][step - 1], out[2][step - 1]};
        s = vkllm_seq_decode(m, seqs, fed, 3, next, NULL);
        for (int i = 0; i < 3; i++) out[i][step] = next[i];
    }
    for (int i = 0; s == VKLLM_STATUS_OK && i < 3; i++) s = vkllm_seq_free(m, seqs[i]);
    if (s != VKLLM_STATUS_OK) {
        vkllm_model_free(m);
        return fail("batch", s);
    }
    int same = 1;
    for (int i = 0; i < 3 && s == VKLLM_STATUS_OK; i++) {
        s = vkllm_reset(m);
        if (s == VKLLM_STATUS_OK) s = vkllm_eval(m, prompts[i], lens[i]);
        for (int step = 0; s == VKLLM_STATUS_OK && step < n; step++) {
            uint32_t t;
            s = vkllm_greedy(m, &t);
            if (s == VKLLM_STATUS_OK && t != out[i][step]) same = 0;
            if (s == VKLLM_STATUS_OK) s = vkllm_eval(m, &t, 1);
        }
    }
    for (int step = 0; step < n; step++) printf(step ? ",%u" : "%u", out[0][step]);
    printf("\n%s\n", same ? "batch == alone" : "batch != alone");
    vkllm_model_free(m);
    return s == VKLLM_STATUS_OK ? 0 : fail("alone", s);
}

static int error(const char *path) {
    vkllm_model *m = NULL;
    vkllm_status s = vkllm_model_load(path, NULL, &m);
    printf("status %d: %s (handle %s)\n", (int)s, vkllm_last_error(), m ? "set" : "NULL");
    return s == VKLLM_STATUS_OK ? 1 : 0;
}

/* A greedy reply to `question` under a JSON schema, then what asking for
 * two constraints at once reports. */
static int json(const char *path, const char *schema, const char *question) {
    vkllm_model *m = load(path);
    if (!m) return 1;
    vkllm_chat_message msg = {"user", question};
    char prompt[8192];
    size_t len;
    vkllm_status s = vkllm_apply_chat_template(m, &msg, 1, true, prompt, sizeof prompt, &len);
    uint32_t ids[2048];
    size_t n_ids = 0;
    if (s == VKLLM_STATUS_OK) s = vkllm_tokenize(m, prompt, false, ids, 2048, &n_ids);
    vkllm_generate_options opts = vkllm_default_generate_options();
    opts.max_tokens = 96;
    opts.sampling.temperature = 0;
    opts.json_schema = schema;
    struct reply r;
    memset(&r, 0, sizeof r);
    size_t generated;
    vkllm_stop why = VKLLM_STOP_TOKEN;
    if (s == VKLLM_STATUS_OK) s = vkllm_generate(m, ids, n_ids, &opts, on_token, &r, &generated, &why);
    if (s != VKLLM_STATUS_OK) {
        vkllm_model_free(m);
        return fail("json", s);
    }
    fprintf(stderr, "\n");
    /* On one line: a raw newline in JSON text is whitespace between tokens. */
    for (char *c = r.text; *c; c++)
        if (*c == '\n') *c = ' ';
    printf("json: %s\n", r.text);
    printf("%zu tokens, stop %d\n", generated, (int)why);
    opts.regex = "[0-9]+";
    s = vkllm_generate(m, ids, n_ids, &opts, NULL, NULL, NULL, NULL);
    printf("two constraints: status %d: %s\n", (int)s, vkllm_last_error());
    vkllm_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "ids") == 0) return ids(argv[2], argv[3], atoi(argv[4]));
    if (argc == 4 && strcmp(argv[1], "chat") == 0) return chat(argv[2], argv[3]);
    if (argc == 5 && strcmp(argv[1], "batch") == 0) return batch(argv[2], argv[3], atoi(argv[4]));
    if (argc == 5 && strcmp(argv[1], "json") == 0) return json(argv[2], argv[3], argv[4]);
    if (argc == 3 && strcmp(argv[1], "error") == 0) return error(argv[2]);
    fprintf(stderr, "usage: demo ids MODEL 1,2,3 N | demo chat MODEL QUESTION | demo batch MODEL 1,2,3 N | demo json MODEL SCHEMA QUESTION | demo error MODEL\n");
    return 2;
}
