// cache.c - the feature cache's directory (cache.h): header, index, data
// files, opening with torn-tail recovery, reading. The build (running the
// target over the corpus) is train/cache_build.c.
#include "train/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "head/head.h"
#include "model/model.h"
#include "train/cache_impl.h"
#include "train/corpus.h"

static const char *const k_file[CACHE_N_FILES] = {"tokens.bin", "top_ids.bin", "top_p.bin", "feats.bin"};

sd_cache_params sd_cache_default_params(void) {
    sd_cache_params p;
    memset(&p, 0, sizeof p);
    p.type = SD_HEAD_EAGLE3;
    p.extract[0] = p.extract[1] = p.extract[2] = -1;
    p.topk = 8;
    p.n_ctx = 2048;
    return p;
}

uint64_t cache_entry_hash(const sd_cache_seq *e) {
    return sd_fnv64(SD_FNV_OFF, e, offsetof(sd_cache_seq, entry_hash));
}

size_t cache_row_bytes(const sd_cache *c, int f) {
    switch (f) {
    case CACHE_TOK: return 4;
    case CACHE_IDS: return 4 * (size_t)c->hdr.topk;
    case CACHE_P: return 2 * (size_t)c->hdr.topk;
    default: return 2 * (size_t)c->hdr.n_feat;
    }
}

static int path_of(const sd_cache *c, const char *name, char *out, size_t n, char *err, size_t errlen) {
    if (snprintf(out, n, "%s/%s", c->dir, name) >= (int)n) return sd_err(err, errlen, "cache: path too long: %s", c->dir);
    return 0;
}

// ---------------------------------------------------------------- header
static void hdr_fill(cache_hdr *h, const sd_model *m, const sd_cache_params *p) {
    memset(h, 0, sizeof *h);
    memcpy(h->magic, "SDFCACHE", 8);
    h->version = SD_CACHE_VERSION;
    h->type = (uint32_t)p->type;
    h->vocab_hash = sd_head_vocab_hash(m);
    h->n_vocab = m->hp.n_vocab;
    h->n_embd = m->hp.n_embd;
    h->n_layer = m->hp.n_layer;
    if (p->type == SD_HEAD_EAGLE3) {
        h->n_extract = 3;
        for (int i = 0; i < 3; i++) h->extract[i] = p->extract[i];
        h->n_feat = 3 * m->hp.n_embd;
    } else if (p->type == SD_HEAD_MOA) {   // the streams entering layers L-N..L-1, then the final normed state
        const int N = p->moa_tli;
        h->n_extract = N + 1;
        for (int i = 0; i < N; i++) h->extract[i] = m->hp.n_layer - N - 1 + i;
        h->extract[N] = SD_HIDDEN_NORM;
        h->n_feat = (1 + N) * 2 * m->hp.n_head_kv * m->hp.head_dim + (N + 1) * m->hp.n_embd;
    } else {
        h->n_extract = 1;
        h->extract[0] = SD_HIDDEN_NORM;
        h->n_feat = m->hp.n_embd;
    }
    h->topk = p->topk;
    h->n_ctx = p->n_ctx;
    h->hash = sd_fnv64(SD_FNV_OFF, h, offsetof(cache_hdr, hash));
}

static const char *type_name(uint32_t t) {
    return t == SD_HEAD_EAGLE3   ? "an EAGLE-3 head"
           : t == SD_HEAD_MEDUSA ? "a Medusa head (or an MoA drafter with LSA, or without it and TLI > 2)"
           : t == SD_HEAD_MOA    ? "an MoA drafter without LSA"
                                 : "an unknown head type";
}

// 0 if the stored header h matches want, else a message naming what differs.
static int hdr_compare(const sd_cache *c, const cache_hdr *h, const cache_hdr *want, char *err, size_t errlen) {
    const char *d = c->dir;
    if (h->vocab_hash != want->vocab_hash || h->n_vocab != want->n_vocab || h->n_embd != want->n_embd ||
        h->n_layer != want->n_layer)
        return sd_err(err, errlen,
                      "the feature cache %s was made for another target (vocabulary %d tokens, fingerprint %016llx, "
                      "hidden size %d, %d layers; this model: %d tokens, %016llx, hidden size %d, %d layers); use "
                      "another --cache directory",
                      d, h->n_vocab, (unsigned long long)h->vocab_hash, h->n_embd, h->n_layer, want->n_vocab,
                      (unsigned long long)want->vocab_hash, want->n_embd, want->n_layer);
    if (h->type != want->type)
        return sd_err(err, errlen, "the feature cache %s was made for %s, not %s; use another --cache directory", d,
                      type_name(h->type), type_name(want->type));
    if (h->type == SD_HEAD_MOA && h->n_extract < want->n_extract)
        return sd_err(err, errlen,
                      "the feature cache %s keeps the rows of %d TLI layers; this drafter runs %d; use another --cache "
                      "directory",
                      d, h->n_extract - 1, want->n_extract - 1);
    if (h->type != SD_HEAD_MOA && (h->n_extract != want->n_extract || memcmp(h->extract, want->extract, sizeof h->extract)))
        return sd_err(err, errlen,
                      "the feature cache %s holds the states of layers %d,%d,%d; this head reads layers %d,%d,%d; use "
                      "another --cache directory",
                      d, h->extract[0], h->extract[1], h->extract[2], want->extract[0], want->extract[1],
                      want->extract[2]);
    if (h->topk != want->topk)
        return sd_err(err, errlen, "the feature cache %s keeps the top %d tokens per position, not %d (--topk)", d,
                      h->topk, want->topk);
    if (h->n_ctx != want->n_ctx)
        return sd_err(err, errlen, "the feature cache %s was built with windows of %d tokens, not %d (--ctx)", d,
                      h->n_ctx, want->n_ctx);
    cache_hdr more = *want;   // an MoA cache keeping more TLI layers: the header it would have
    if (h->type == SD_HEAD_MOA) {
        const int N = h->n_extract - 1, ekv = (want->n_feat - want->n_extract * want->n_embd) / want->n_extract;
        if (N < 0 || N > SD_CACHE_MAX_MOA_TLI) return sd_err(err, errlen, "the feature cache %s: bad MoA layers", d);
        for (int i = 0; i < N; i++) more.extract[i] = want->n_layer - N - 1 + i;
        more.extract[N] = SD_HIDDEN_NORM;
        more.n_extract = N + 1;
        more.n_feat = (1 + N) * ekv + (N + 1) * want->n_embd;
        if (memcmp(h->extract, more.extract, sizeof h->extract))
            return sd_err(err, errlen, "the feature cache %s: bad MoA layers", d);
    }
    if (h->n_feat != more.n_feat) return sd_err(err, errlen, "the feature cache %s: bad state size %d", d, h->n_feat);
    return 0;
}

static int hdr_write(const sd_cache *c, const cache_hdr *h, char *err, size_t errlen) {
    char path[4200], tmp[4300];
    if (path_of(c, "header.bin", path, sizeof path, err, errlen) < 0) return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return sd_err(err, errlen, "cache: cannot write %s: %s", tmp, strerror(errno));
    int ok = fwrite(h, sizeof *h, 1, f) == 1;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return sd_err(err, errlen, "cache: writing %s failed: %s", path, strerror(e));
    }
    return 0;
}

// Reads and checks the stored header; *absent = 1 when there is none.
static int hdr_read(const sd_cache *c, cache_hdr *h, int *absent, char *err, size_t errlen) {
    char path[4200];
    if (path_of(c, "header.bin", path, sizeof path, err, errlen) < 0) return -1;
    *absent = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) return *absent = 1, 0;
        return sd_err(err, errlen, "cache: cannot read %s: %s", path, strerror(errno));
    }
    int ok = fread(h, sizeof *h, 1, f) == 1;
    fclose(f);
    if (!ok || memcmp(h->magic, "SDFCACHE", 8))
        return sd_err(err, errlen, "%s is not a specdec feature cache header", path);
    if (h->version != SD_CACHE_VERSION)
        return sd_err(err, errlen, "%s: cache version %u, this build reads version %d", path, h->version,
                      SD_CACHE_VERSION);
    if (h->hash != sd_fnv64(SD_FNV_OFF, h, offsetof(cache_hdr, hash)))
        return sd_err(err, errlen, "%s: header checksum mismatch (corrupted)", path);
    if (h->topk < 1 || h->topk > SD_CACHE_MAX_TOPK || h->n_feat < 1 || h->n_ctx < 2)
        return sd_err(err, errlen, "%s: bad header values", path);
    return 0;
}

// ---------------------------------------------------------------- index and torn tail
static int64_t file_size(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? (int64_t)st.st_size : -1;
}

int cache_pread(int fd, void *buf, size_t n, int64_t off) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

int cache_pwrite(int fd, const void *buf, size_t n, int64_t off) {
    const char *p = buf;
    while (n) {
        ssize_t r = pwrite(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = ENOSPC;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

// Hash of positions [pos0, pos0 + T) of the four data files, as the build computes it.
static int data_hash(const sd_cache *c, uint64_t pos0, int T, uint64_t *out) {
    uint64_t hs[CACHE_N_FILES];
    char buf[1 << 16];
    for (int f = 0; f < CACHE_N_FILES; f++) {
        size_t rb = cache_row_bytes(c, f);
        int64_t off = (int64_t)(pos0 * rb), n = (int64_t)T * (int64_t)rb;
        hs[f] = SD_FNV_OFF;
        while (n > 0) {
            size_t k = (size_t)SD_MIN(n, (int64_t)sizeof buf);
            if (cache_pread(c->fd[f], buf, k, off) < 0) return -1;
            hs[f] = sd_fnv64(hs[f], buf, k);
            off += (int64_t)k;
            n -= (int64_t)k;
        }
    }
    *out = sd_fnv64(SD_FNV_OFF, hs, sizeof hs);
    return 0;
}

// Keeps the first n entries: drops the rest of the index, recomputes the totals.
static void keep_entries(sd_cache *c, int64_t n) {
    c->n_seq = n;
    c->n_pos = n ? (int64_t)(c->seq[n - 1].pos0 + (uint64_t)c->seq[n - 1].T) : 0;
    c->n_rec = n ? (int64_t)c->seq[n - 1].record + 1 : 0;
}

// Loads index.bin and cuts whatever a crash may have left half-written.
static int index_load(sd_cache *c, char *note, size_t notelen, char *err, size_t errlen) {
    int64_t sz = file_size(c->fd_index);
    if (sz < 0) return sd_err(err, errlen, "cache %s: index.bin: %s", c->dir, strerror(errno));
    int64_t n = sz / (int64_t)sizeof(sd_cache_seq);
    c->cap = n > 16 ? n : 16;
    c->seq = malloc(sizeof(sd_cache_seq) * (size_t)c->cap);
    if (!c->seq) return sd_err(err, errlen, "cache: out of memory for %lld index entries", (long long)n);
    if (n && cache_pread(c->fd_index, c->seq, sizeof(sd_cache_seq) * (size_t)n, 0) < 0)
        return sd_err(err, errlen, "cache %s: reading index.bin: %s", c->dir, strerror(errno));
    // entries that check out, in order, each continuing the one before it
    int64_t good = 0;
    uint64_t pos = 0, rec = 0;
    for (; good < n; good++) {
        const sd_cache_seq *e = &c->seq[good];
        int first = good == 0 || (c->seq[good - 1].window & SD_CACHE_LAST_WINDOW);
        uint32_t w = e->window & ~SD_CACHE_LAST_WINDOW;
        if (e->entry_hash != cache_entry_hash(e) || e->pos0 != pos || e->T < 0 || e->T > c->hdr.n_ctx ||
            e->record != rec || (first ? w != 0 : w != (c->seq[good - 1].window & ~SD_CACHE_LAST_WINDOW) + 1))
            break;
        pos += (uint64_t)e->T;
        if (e->window & SD_CACHE_LAST_WINDOW) rec++;
    }
    int64_t keep = good;
    while (keep > 0 && !(c->seq[keep - 1].window & SD_CACHE_LAST_WINDOW)) keep--;   // an unfinished record
    const int64_t done = keep;
    // data that is not all there (a crash after the index reached the disk, not the data)
    for (;;) {
        keep_entries(c, keep);
        int ok = 1;
        for (int f = 0; f < CACHE_N_FILES; f++)
            if (file_size(c->fd[f]) < c->n_pos * (int64_t)cache_row_bytes(c, f)) ok = 0;
        if (ok && keep > 0) {   // the last record's data must hash as written
            int64_t first = keep - 1;
            while (first > 0 && !(c->seq[first - 1].window & SD_CACHE_LAST_WINDOW)) first--;
            for (int64_t i = first; i < keep && ok; i++) {
                uint64_t h;
                if (data_hash(c, c->seq[i].pos0, c->seq[i].T, &h) < 0 || h != c->seq[i].data_hash) ok = 0;
            }
        }
        if (ok || keep == 0) break;
        keep--;
        while (keep > 0 && !(c->seq[keep - 1].window & SD_CACHE_LAST_WINDOW)) keep--;
    }
    // the windows of an unfinished record after them whose data is all there
    // and hashes as written (the build resumes the record from there)
    c->n_part = c->part_pos = 0;
    for (int64_t i = keep; keep == done && i < good; i++) {
        uint64_t h;
        int ok = 1;
        for (int f = 0; f < CACHE_N_FILES; f++)
            if (file_size(c->fd[f]) < (c->n_pos + c->part_pos + c->seq[i].T) * (int64_t)cache_row_bytes(c, f)) ok = 0;
        if (!ok || data_hash(c, c->seq[i].pos0, c->seq[i].T, &h) < 0 || h != c->seq[i].data_hash) break;
        c->n_part++;
        c->part_pos += c->seq[i].T;
    }
    // cut the files to what is kept
    const int64_t n_keep = keep + c->n_part;
    int cut = n != n_keep || sz != n_keep * (int64_t)sizeof(sd_cache_seq);
    if (ftruncate(c->fd_index, (off_t)(n_keep * (int64_t)sizeof(sd_cache_seq))) != 0)
        return sd_err(err, errlen, "cache %s: cannot cut index.bin: %s", c->dir, strerror(errno));
    for (int f = 0; f < CACHE_N_FILES; f++) {
        int64_t want = (c->n_pos + c->part_pos) * (int64_t)cache_row_bytes(c, f);
        if (file_size(c->fd[f]) != want) {
            cut = 1;
            if (ftruncate(c->fd[f], (off_t)want) != 0)
                return sd_err(err, errlen, "cache %s: cannot cut %s: %s", c->dir, k_file[f], strerror(errno));
        }
    }
    if (cut && note)
        snprintf(note, notelen, "cut a torn tail from the feature cache %s: kept %lld records (%lld entries of %lld)",
                 c->dir, (long long)c->n_rec, (long long)n_keep, (long long)n);
    if (c->n_part && note && notelen) {
        size_t o = strlen(note);
        snprintf(note + o, notelen - o, "%sthe feature cache %s holds %lld windows (%lld positions) of record %lld, "
                 "unfinished: the build goes on from there", o ? "; " : "", c->dir, (long long)c->n_part,
                 (long long)c->part_pos, (long long)c->n_rec + 1);
    }
    return 0;
}

// ---------------------------------------------------------------- open / close
int sd_cache_open(sd_cache **out, const char *dir, const sd_model *m, const sd_cache_params *p, char *note,
                  size_t notelen, char *err, size_t errlen) {
    *out = NULL;
    if (note && notelen) note[0] = 0;
    if (p->type != SD_HEAD_EAGLE3 && p->type != SD_HEAD_MEDUSA && p->type != SD_HEAD_MOA)
        return sd_err(err, errlen, "cache: unknown head type %d", p->type);
    if (p->type == SD_HEAD_MOA && (p->moa_tli < 0 || p->moa_tli > SD_CACHE_MAX_MOA_TLI))
        return sd_err(err, errlen, "cache: an MoA cache keeps 0..%d TLI layers, not %d", SD_CACHE_MAX_MOA_TLI,
                      p->moa_tli);
    if (p->type == SD_HEAD_MOA && p->moa_tli >= m->hp.n_layer)
        return sd_err(err, errlen, "cache: TLI %d must leave a target layer before it (the target has %d)",
                      p->moa_tli, m->hp.n_layer);
    if (p->topk < 1 || p->topk > SD_CACHE_MAX_TOPK)
        return sd_err(err, errlen, "cache: topk %d out of range 1..%d", p->topk, SD_CACHE_MAX_TOPK);
    if (p->n_ctx < 2) return sd_err(err, errlen, "cache: window of %d tokens (at least 2)", p->n_ctx);
    if (p->type == SD_HEAD_EAGLE3)
        for (int i = 0; i < 3; i++)
            if (p->extract[i] < 0 || p->extract[i] >= m->hp.n_layer)
                return sd_err(err, errlen, "cache: extract layer %d is outside the target's %d layers", p->extract[i],
                              m->hp.n_layer);
    if (strlen(dir) > 4000) return sd_err(err, errlen, "cache: path too long");
    sd_cache *c = calloc(1, sizeof *c);
    if (!c) return sd_err(err, errlen, "out of memory");
    c->fd_index = -1;
    for (int f = 0; f < CACHE_N_FILES; f++) c->fd[f] = -1;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    *out = c;   // freed below on error
    sd_cache_params q = *p;   // the window never exceeds what the target was trained on
    if (m->hp.n_ctx_train > 1 && q.n_ctx > m->hp.n_ctx_train) q.n_ctx = m->hp.n_ctx_train;
    cache_hdr want;
    hdr_fill(&want, m, &q);
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (mkdir(dir, 0777) != 0) {
            sd_err(err, errlen, "cannot create the feature cache directory %s: %s", dir, strerror(errno));
            goto fail;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        sd_err(err, errlen, "the feature cache %s is not a directory", dir);
        goto fail;
    }
    int absent;
    if (hdr_read(c, &c->hdr, &absent, err, errlen) < 0) goto fail;
    char path[4200];
    if (absent) {
        if (path_of(c, "index.bin", path, sizeof path, err, errlen) < 0) goto fail;
        if (access(path, F_OK) == 0) {
            sd_err(err, errlen, "the feature cache %s has data but no header.bin; use another --cache directory", dir);
            goto fail;
        }
        c->hdr = want;
        if (hdr_write(c, &c->hdr, err, errlen) < 0) goto fail;
    } else if (hdr_compare(c, &c->hdr, &want, err, errlen) < 0) {
        goto fail;
    }
    for (int f = -1; f < CACHE_N_FILES; f++) {
        if (path_of(c, f < 0 ? "index.bin" : k_file[f], path, sizeof path, err, errlen) < 0) goto fail;
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            sd_err(err, errlen, "cache: cannot open %s: %s", path, strerror(errno));
            goto fail;
        }
        if (f < 0) c->fd_index = fd;
        else c->fd[f] = fd;
    }
    if (index_load(c, note, notelen, err, errlen) < 0) goto fail;
    return 0;
fail:
    sd_cache_close(c);
    *out = NULL;
    return -1;
}

void sd_cache_close(sd_cache *c) {
    if (!c) return;
    if (c->fd_index >= 0) close(c->fd_index);
    for (int f = 0; f < CACHE_N_FILES; f++)
        if (c->fd[f] >= 0) close(c->fd[f]);
    free(c->seq);
    free(c->f16);
    free(c);
}

const sd_cache_seq *sd_cache_seqs(const sd_cache *c, int64_t *n) {
    if (n) *n = c->n_seq;
    return c->seq;
}
int64_t sd_cache_n_records(const sd_cache *c) { return c->n_rec; }
int64_t sd_cache_n_positions(const sd_cache *c) { return c->n_pos; }
int sd_cache_n_feat(const sd_cache *c) { return c->hdr.n_feat; }
int sd_cache_topk(const sd_cache *c) { return c->hdr.topk; }

// ---------------------------------------------------------------- reading
// F16 rows of file f at positions [pos, pos + T) into floats.
static int read_f16(sd_cache *c, int f, uint64_t pos, int T, float *out) {
    size_t rb = cache_row_bytes(c, f), per = rb / 2, need = rb * (size_t)T;
    if (c->f16_cap < need) {
        free(c->f16);
        c->f16 = malloc(need);
        c->f16_cap = c->f16 ? need : 0;
        if (!c->f16) return -1;
    }
    if (cache_pread(c->fd[f], c->f16, need, (int64_t)(pos * rb)) < 0) return -1;
    for (size_t i = 0; i < per * (size_t)T; i++) out[i] = sd_fp16_to_fp32(c->f16[i]);
    return 0;
}

int sd_cache_read(sd_cache *c, int64_t seq, int off, int T, int32_t *tokens, float *feats, int32_t *top_ids,
                  float *top_p, char *err, size_t errlen) {
    if (seq < 0 || seq >= c->n_seq || off < 0 || T < 0 || off + T > c->seq[seq].T)
        return sd_err(err, errlen, "cache: positions [%d, %d) of sequence %lld are out of range", off, off + T,
                      (long long)seq);
    uint64_t pos = c->seq[seq].pos0 + (uint64_t)off;
    int bad = 0;
    if (tokens) bad |= cache_pread(c->fd[CACHE_TOK], tokens, 4 * (size_t)T, (int64_t)pos * 4) < 0;
    if (top_ids)
        bad |= cache_pread(c->fd[CACHE_IDS], top_ids, cache_row_bytes(c, CACHE_IDS) * (size_t)T,
                           (int64_t)(pos * cache_row_bytes(c, CACHE_IDS))) < 0;
    if (top_p) bad |= read_f16(c, CACHE_P, pos, T, top_p) < 0;
    if (feats) bad |= read_f16(c, CACHE_FEAT, pos, T, feats) < 0;
    if (bad) return sd_err(err, errlen, "cache %s: read error: %s", c->dir, strerror(errno));
    return 0;
}

int sd_cache_argmax_counts(sd_cache *c, const int64_t *seqs, int64_t n, int64_t *counts, char *err, size_t errlen) {
    const int k = c->hdr.topk;
    enum { CHUNK = 4096 };
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)k * CHUNK);
    if (!buf) return sd_err(err, errlen, "out of memory");
    if (!seqs) n = c->n_seq;
    for (int64_t i = 0; i < n; i++) {
        const sd_cache_seq *e = &c->seq[seqs ? seqs[i] : i];
        for (int off = 0; off < e->T; off += CHUNK) {
            int T = SD_MIN(CHUNK, e->T - off);
            if (cache_pread(c->fd[CACHE_IDS], buf, sizeof(int32_t) * (size_t)k * (size_t)T,
                            (int64_t)((e->pos0 + (uint64_t)off) * sizeof(int32_t) * (size_t)k)) < 0) {
                free(buf);
                return sd_err(err, errlen, "cache %s: read error: %s", c->dir, strerror(errno));
            }
            for (int t = 0; t < T; t++) {
                int32_t a = buf[(size_t)t * (size_t)k];
                if (a >= 0 && a < c->hdr.n_vocab) counts[a]++;
            }
        }
    }
    free(buf);
    return 0;
}
