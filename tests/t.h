// t.h - the tiny test harness shared by every test program.
// A test program defines cases as functions and runs them with T_RUN. Each
// case prints one line: "PASS name", "FAIL name" (after the failed checks'
// messages) or "SKIP name: reason". scripts/run-tests.sh counts these lines.
// A program whose cases exercise the compute kernels calls t_families(argv)
// first: it then runs once per kernel family this CPU supports, and each line
// names the family ("PASS name [avx2]"); see t_families below.
#ifndef SD_T_H
#define SD_T_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int t_case_failed;   // checks failed in the current case
static int t_case_skipped;  // current case asked to skip
static char t_skip_why[256];
static int t_n_fail;        // failed cases in this program
static const char *t_family; // kernel family under test (t_families), or NULL

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            t_case_failed++;                                               \
            printf("  check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                           \
            printf("\n");                                                  \
            fflush(stdout);                                                \
        }                                                                  \
    } while (0)

// Ends the current case as skipped, with a reason that is printed.
#define SKIP(...)                                                          \
    do {                                                                   \
        t_case_skipped = 1;                                                \
        snprintf(t_skip_why, sizeof t_skip_why, __VA_ARGS__);              \
        return;                                                            \
    } while (0)

#define T_RUN(fn)                                                          \
    do {                                                                   \
        t_case_failed = 0;                                                 \
        t_case_skipped = 0;                                                \
        fn();                                                              \
        if (t_case_skipped && !t_case_failed)                              \
            printf("SKIP %s%s: %s\n", #fn, t_family_tag(), t_skip_why);    \
        else if (t_case_failed) {                                          \
            printf("FAIL %s%s\n", #fn, t_family_tag());                    \
            t_n_fail++;                                                    \
        } else                                                             \
            printf("PASS %s%s\n", #fn, t_family_tag());                    \
        fflush(stdout);                                                    \
    } while (0)

#define T_EXIT() return t_n_fail ? 1 : 0

// " [family]" while a family is under test, else "".
static inline const char *t_family_tag(void) {
    static char tag[40];
    if (!t_family) return "";
    snprintf(tag, sizeof tag, " [%s]", t_family);
    return tag;
}

// ---- kernel families
// (declared in include/specdec.h and src/kernels/quant.h)
int sd_backend_select(const char *name, char *err, size_t errlen);
int sd_quant_init_backend(const char *name);

// Every kernel family, best first. "scalar" (the plain C references) exists
// everywhere; the others need the CPU and a build that has them.
static const char *const t_all_families[] = {"avx512-vnni", "avx2", "scalar"};
#define T_N_FAMILIES 3

// Why this CPU or build lacks family f (after sd_quant_init_backend refused it).
static inline const char *t_family_lack(const char *f) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!strcmp(f, "avx512-vnni") &&
        (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
         !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512vnni")))
        return "this CPU lacks AVX-512 F/BW/VL/VNNI";
    if (!strcmp(f, "avx2") && (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")))
        return "this CPU lacks AVX2 + FMA";
    return "this CPU has it but this build does not (built without the instruction set, e.g. no -march=native)";
#else
    (void)f;
    return "not an x86-64 build";
#endif
}

// Runs the program once per kernel family. Call first in main (argv: main's).
// Without SD_TEST_KERNELS in the environment, the program runs itself again
// (fork, exec) with SD_TEST_KERNELS=<family> for every family this CPU and
// build support, one after the other (their lines go to stdout as they come),
// prints "SKIP kernels [family]: why" for each family it lacks and one info
// line naming the families that ran, then exits: 0 if every run passed, else
// 1 (a run killed by a signal, or failing without a FAIL line, adds a FAIL
// line). With SD_TEST_KERNELS=<family> (set here, or by hand to run one
// family) it selects that family for the process (sd_backend_select) and
// returns; T_RUN lines then end in " [family]". Test-only reinstalls of the
// kernel table (sd_quant_init) must use t_kernels_reset to come back to it.
static inline void t_families(char **argv) {
    const char *e = getenv("SD_TEST_KERNELS");
    if (e && *e) {
        char err[256];
        t_family = e;
        if (sd_backend_select(e, err, sizeof err) != 0) {
            printf("SKIP kernels [%s]: %s\n", e, err);
            exit(0);
        }
        return;
    }
    char ran[128] = "";
    int bad = 0;
    for (int i = 0; i < T_N_FAMILIES; i++) {
        const char *f = t_all_families[i];
        if (sd_quant_init_backend(f) != 0) {
            printf("SKIP kernels [%s]: %s\n", f, t_family_lack(f));
            continue;
        }
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("SD_TEST_KERNELS", f, 1);
            execv("/proc/self/exe", argv);
            printf("FAIL kernels [%s]: exec of /proc/self/exe failed\n", f);
            fflush(stdout);
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid) {
            printf("FAIL kernels [%s]: fork / wait failed\n", f);
            bad = 1;
            continue;
        }
        if (WIFSIGNALED(st)) {
            printf("FAIL kernels [%s]: the run was killed by signal %d\n", f, WTERMSIG(st));
            bad = 1;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            bad = 1; // T_EXIT's 1: its FAIL lines say why; any other status has none
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 1)
                printf("FAIL kernels [%s]: the run exited with status %d\n", f, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        }
        snprintf(ran + strlen(ran), sizeof ran - strlen(ran), " %s", f);
    }
    printf("  info: kernel families run:%s\n", ran);
    fflush(stdout);
    exit(bad);
}

// Cases on a real model (the default one) are slow under the scalar family
// (test_forward's default-model case: 28 s against 2 s under avx512-vnni, on
// this busy 2-core machine); they call this first: under "scalar", unless
// SD_TEST_SLOW=1 is set, it gives the reason to skip them (the
// synthetic-model cases of the same programs run every family), else NULL.
static inline const char *t_slow_family(void) {
    const char *e = getenv("SD_TEST_SLOW");
    if (!t_family || strcmp(t_family, "scalar") != 0 || (e && !strcmp(e, "1"))) return NULL;
    return "the default model is slow under the scalar kernels (set SD_TEST_SLOW=1 to run it); the synthetic "
           "models of this program check the scalar family";
}

// Reinstalls the kernel table of the family under test (after a test-only
// sd_quant_init / sd_quant_init_backend of another one); "auto" outside
// t_families.
static inline void t_kernels_reset(void) {
    if (sd_quant_init_backend(t_family ? t_family : "auto") != 0) {
        printf("  check failed: family %s could not be reinstalled\n", t_family);
        abort();
    }
}

// Path of ../shared (the directory beside the repository), or NULL if absent.
// SD_SHARED overrides it for unusual layouts; naming a directory that does
// not exist, it gives NULL as a clone without ../shared does
// (`SD_SHARED=/nonexistent make test` shows what such a clone skips).
static inline const char *t_shared_dir(void) {
    const char *e = getenv("SD_SHARED");
    static const char *cands[] = {"../shared", "../../shared"};
    if (e && *e) {
        struct stat st;
        return stat(e, &st) == 0 && S_ISDIR(st.st_mode) ? e : NULL;
    }
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/models/README.md", cands[i]);
        FILE *f = fopen(p, "rb");
        if (f) {
            fclose(f);
            return cands[i];
        }
    }
    return NULL;
}

#endif
