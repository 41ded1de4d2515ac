/*
 * A stand-in libnvidia-ml.so.1 for tests on machines without an NVIDIA GPU.
 *
 * The real Python bindings (nvidia-ml-py, module `pynvml`) load this file in
 * place of NVIDIA's library and call it through ctypes exactly as they call
 * the driver's.  What the "GPUs" answer comes from a scenario file named by the
 * environment variable GPUTOP_NVML_STANDIN (format: tests/nvml_standin/__init__.py
 * writes it; the parser is scenario_parse() below).  The file is read at
 * nvmlInit and re-read whenever its inode, size or mtime changes, checked on
 * every nvmlDeviceGetCount(_v2) call, so a test can rewrite it mid-run.
 *
 * Struct layouts and constants follow pynvml 13.615.71's ctypes declarations
 * (its _fields_ lists mirror NVIDIA's nvml.h).  Each exported function sits in
 * `#ifndef OMIT_<name>` so a build can leave the symbol out, the way an older
 * driver lacks it.  -DPROCINFO_V3_SIZE=32 makes the *_v3 process calls write
 * the 32-byte entries of early R535 drivers (see PROCINFO_V3_SIZE below).
 *
 * Build: cc -shared -fPIC -O1 -Wall -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 libnvidia-ml.c
 * Extra, non-NVML exports for tests: standin_calls(name), standin_reset().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- NVML constants (values as in pynvml 13.615.71 / nvml.h) ------------------------------ */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE ULLONG_MAX /* pynvml: NVML_VALUE_NOT_AVAILABLE_ulonglong = c_ulonglong(-1) */
#define NO_INSTANCE_ID 0xFFFFFFFFu         /* gpuInstanceId/computeInstanceId of a process outside MIG */

#define NVML_TEMPERATURE_GPU 0
#define NVML_CLOCK_GRAPHICS 0
#define NVML_CLOCK_SM 1
#define NVML_CLOCK_MEM 2
#define NVML_CLOCK_VIDEO 3
#define NVML_PCIE_UTIL_TX_BYTES 0
#define NVML_PCIE_UTIL_RX_BYTES 1
#define NVML_VALUE_TYPE_UNSIGNED_LONG_LONG 3

/* Field ids (pynvml: NVML_FI_DEV_*) */
#define FI_NVLINK_LINK_COUNT 91
#define FI_NVLINK_THROUGHPUT_DATA_TX 138 /* KiB */
#define FI_NVLINK_THROUGHPUT_DATA_RX 139 /* KiB */
#define FI_PCIE_COUNT_TX_BYTES 197
#define FI_PCIE_COUNT_RX_BYTES 198

/* Versioned structs carry sizeof(struct) | (version << 24) in their first word: that is
 * NVML_STRUCT_VERSION in nvml.h (explained by an NVIDIA engineer in NVIDIA/nvidia-settings
 * issue #78).  The values below are the ones pynvml 13.615.71 passes. */
#define NVML_MEMORY_V2 0x02000028u      /* pynvml: nvmlMemory_v2 */
#define NVML_TEMPERATURE_V1 0x0100000Cu /* pynvml: nvmlTemperature_v1 */
#define NVML_GPM_SUPPORT_VERSION 1u      /* pynvml: NVML_GPM_SUPPORT_VERSION */
#define NVML_GPM_METRICS_GET_VERSION 1u  /* pynvml: NVML_GPM_METRICS_GET_VERSION */
#define NVML_GPM_METRIC_MAX 477          /* pynvml: NVML_GPM_METRIC_MAX, the size of metrics[] */
#define GPM_METRIC_SM_UTIL 2             /* pynvml: NVML_GPM_METRIC_SM_UTIL */
#define GPM_METRIC_ANY_TENSOR_UTIL 5     /* pynvml: NVML_GPM_METRIC_ANY_TENSOR_UTIL */

#define MAX_MIG_DEVICES 7 /* an A100/H100 holds at most seven GPU instances (1g slices) */

/* C99 compile-time size check (no _Static_assert before C11). */
#define STATIC_CHECK(name, cond) typedef char static_check_##name[(cond) ? 1 : -1]
#define SIZE_CHECK(name, type, size) STATIC_CHECK(name, sizeof(type) == (size))

/* ---- NVML structs, laid out as pynvml's ctypes Structures --------------------------------- */

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_v1_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* nvmlProcessInfo_v1_t: the unversioned nvmlDeviceGet*RunningProcesses. */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
/* nvmlProcessInfo_v2_t: what _v2 writes, and what pynvml reads for _v3 as well
 * (pynvml: c_nvmlProcessInfo_v3_t = c_nvmlProcessInfo_v2_t). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
/* The entry early R535 drivers wrote from the _v3 calls: the v2 fields plus
 * usedGpuCcProtectedMemory, with no version bump (nvitop PR #79 "fix process info support for
 * NVIDIA R535 driver", nvitop issue #88 on driver 535.98). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_r535_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* microseconds */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp;   /* microseconds since the epoch */
    long long latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
typedef struct {
    unsigned int version, numMetrics;
    void *sample1, *sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

SIZE_CHECK(memory_v2, nvmlMemory_v2_t, 40); /* the low bits of NVML_MEMORY_V2 */
SIZE_CHECK(temperature_v1, nvmlTemperature_v1_t, 12);
SIZE_CHECK(procinfo_v1, nvmlProcessInfo_v1_t, 16);
SIZE_CHECK(procinfo_v2, nvmlProcessInfo_v2_t, 24);
SIZE_CHECK(procinfo_r535, nvmlProcessInfo_r535_t, 32);
SIZE_CHECK(field_value, nvmlFieldValue_t, 40);
SIZE_CHECK(util_sample, nvmlProcessUtilizationSample_t, 32);
SIZE_CHECK(gpm_metric, nvmlGpmMetric_t, 40);
SIZE_CHECK(pci_info, nvmlPciInfo_t, 68);
/* The process entries share their leading fields, so one entry can be written as a prefix. */
STATIC_CHECK(v1_prefix, offsetof(nvmlProcessInfo_v1_t, usedGpuMemory) == offsetof(nvmlProcessInfo_r535_t, usedGpuMemory));
STATIC_CHECK(v2_prefix, offsetof(nvmlProcessInfo_v2_t, computeInstanceId) == offsetof(nvmlProcessInfo_r535_t, computeInstanceId));

#ifndef PROCINFO_V3_SIZE
#define PROCINFO_V3_SIZE 24
#endif
#if PROCINFO_V3_SIZE != 24 && PROCINFO_V3_SIZE != 32
#error "PROCINFO_V3_SIZE must be 24 (current drivers) or 32 (early R535)"
#endif

/* ---- the scenario ------------------------------------------------------------------------ */

#define MAX_GPUS 64
#define MAX_PROCS 128
#define MAX_SAMPLES 256
#define MAX_LISTED 32
#define STR_LEN 96
#define FN_LEN 80

struct proc { unsigned int pid; unsigned long long bytes; };
struct sample { unsigned int pid; unsigned long long ts; unsigned int sm, mem; };

struct mig {
    int present;
    char uuid[STR_LEN], name[STR_LEN];
    unsigned long long total, used;
    int nprocs;
    struct proc procs[MAX_PROCS];
};

struct gpu {
    char uuid[STR_LEN], name[STR_LEN];
    unsigned int util_gpu, util_mem;
    unsigned long long mem_total, mem_reserved, mem_used;
    unsigned int power_mw, power_limit_mw, temp_c, sm_mhz, mem_mhz;
    unsigned int pcie_rx_kib_s, pcie_tx_kib_s, pcie_delay_ms;
    int has_pcie_bytes, pcie_counters_unsupported;
    unsigned long long pcie_rx_bytes, pcie_tx_bytes;
    int has_nvlink;
    unsigned int nvlink_links;
    unsigned long long nvlink_rx_kib, nvlink_tx_kib;
    unsigned long long clock_events, ecc;
    int lost;
    int has_gpm;
    double gpm_sm, gpm_tensor;
    int mig_enabled;
    struct mig mig[MAX_MIG_DEVICES];
    int cc_major, cc_minor;
    int nprocs, ngraphics, nsamples, nunsupported, nno_permission;
    struct proc procs[MAX_PROCS], graphics[MAX_PROCS];
    struct sample samples[MAX_SAMPLES];
    char unsupported[MAX_LISTED][FN_LEN], no_permission[MAX_LISTED][FN_LEN];
};

struct scenario {
    char driver[80];
    int cuda;
    int init_error;
    int ngpus;
    struct gpu gpus[MAX_GPUS];
};

/* ---- global state, all guarded by `lock` ------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct scenario S;          /* the scenario in force */
static int loaded;                 /* S holds a parsed file */
static char loaded_path[4096];     /* ... from this path */
static struct stat loaded_stat;    /* ... as it was when read */
static int init_refcount;          /* nvmlInit* minus nvmlShutdown, as real NVML counts */

/* Handles are addresses in these tables, so they stay valid across scenario reloads. */
struct handle { int gpu, slot; }; /* slot -1: the GPU itself; 0..6: a MIG device */
static struct handle gpu_handles[MAX_GPUS];
static struct handle mig_handles[MAX_GPUS][MAX_MIG_DEVICES];

/* Per-function call counters, read by standin_calls(). */
#define MAX_COUNTED 128
static struct { const char *name; unsigned long long n; } counters[MAX_COUNTED];

static void count_call(const char *fn)
{
    for (int i = 0; i < MAX_COUNTED; i++) {
        if (counters[i].name == NULL) {
            counters[i].name = fn; /* __func__ strings live as long as the library */
            counters[i].n = 1;
            return;
        }
        if (strcmp(counters[i].name, fn) == 0) {
            counters[i].n++;
            return;
        }
    }
}

/* ---- scenario file parsing --------------------------------------------------------------- */

/* Split a line into tokens in place: whitespace separated, "double quoted" tokens may hold
 * spaces, and a token starting with # ends the line. */
static int tokenize(char *s, char **tok, int max)
{
    int n = 0;
    while (n < max) {
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s == '\0' || *s == '#') break;
        if (*s == '"') {
            tok[n++] = ++s;
            while (*s && *s != '"') s++;
        } else {
            tok[n++] = s;
            while (*s && *s != ' ' && *s != '\t' && *s != '\r') s++;
        }
        if (*s == '\0') break;
        *s++ = '\0';
    }
    return n;
}

static unsigned long long parse_u64(const char *s)
{
    if (strcmp(s, "-") == 0) return NVML_VALUE_NOT_AVAILABLE; /* "not available", e.g. WDDM */
    return strtoull(s, NULL, 0);
}

static void copy_text(char *dst, size_t size, const char *src)
{
    snprintf(dst, size, "%s", src);
}

static void add_proc(struct proc *list, int *n, char **tok)
{
    if (*n >= MAX_PROCS) return;
    list[*n].pid = (unsigned int)strtoul(tok[0], NULL, 0);
    list[*n].bytes = parse_u64(tok[1]);
    (*n)++;
}

static void add_name(char list[][FN_LEN], int *n, const char *name)
{
    if (*n < MAX_LISTED) copy_text(list[(*n)++], FN_LEN, name);
}

/* One `gpu N key values...` line; tok[0] is the key. */
static void parse_gpu_line(struct gpu *g, char **tok, int n)
{
    const char *key = tok[0];
    char **v = tok + 1;
    int nv = n - 1;

    if (strcmp(key, "uuid") == 0 && nv >= 1) {
        copy_text(g->uuid, sizeof g->uuid, v[0]);
    } else if (strcmp(key, "name") == 0 && nv >= 1) {
        /* a quoted name, or the rest of the line joined by single spaces */
        g->name[0] = '\0';
        for (int i = 0; i < nv; i++) {
            size_t used = strlen(g->name);
            snprintf(g->name + used, sizeof g->name - used, "%s%s", i ? " " : "", v[i]);
        }
    } else if (strcmp(key, "util") == 0 && nv >= 2) {
        g->util_gpu = (unsigned int)strtoul(v[0], NULL, 0);
        g->util_mem = (unsigned int)strtoul(v[1], NULL, 0);
    } else if (strcmp(key, "memory") == 0 && nv >= 3) {
        g->mem_total = parse_u64(v[0]);
        g->mem_reserved = parse_u64(v[1]);
        g->mem_used = parse_u64(v[2]);
    } else if (strcmp(key, "power") == 0 && nv >= 2) {
        g->power_mw = (unsigned int)strtoul(v[0], NULL, 0);
        g->power_limit_mw = (unsigned int)strtoul(v[1], NULL, 0);
    } else if (strcmp(key, "temp") == 0 && nv >= 1) {
        g->temp_c = (unsigned int)strtoul(v[0], NULL, 0);
    } else if (strcmp(key, "clocks") == 0 && nv >= 2) {
        g->sm_mhz = (unsigned int)strtoul(v[0], NULL, 0);
        g->mem_mhz = (unsigned int)strtoul(v[1], NULL, 0);
    } else if (strcmp(key, "pcie_kib_s") == 0 && nv >= 2) {
        g->pcie_rx_kib_s = (unsigned int)strtoul(v[0], NULL, 0);
        g->pcie_tx_kib_s = (unsigned int)strtoul(v[1], NULL, 0);
    } else if (strcmp(key, "pcie_delay_ms") == 0 && nv >= 1) {
        g->pcie_delay_ms = (unsigned int)strtoul(v[0], NULL, 0);
    } else if (strcmp(key, "pcie_bytes") == 0 && nv >= 2) {
        g->has_pcie_bytes = 1;
        g->pcie_rx_bytes = parse_u64(v[0]);
        g->pcie_tx_bytes = parse_u64(v[1]);
    } else if (strcmp(key, "pcie_counters_unsupported") == 0 && nv >= 1) {
        g->pcie_counters_unsupported = atoi(v[0]);
    } else if (strcmp(key, "nvlink") == 0 && nv >= 3) {
        g->has_nvlink = 1;
        g->nvlink_links = (unsigned int)strtoul(v[0], NULL, 0);
        g->nvlink_rx_kib = parse_u64(v[1]);
        g->nvlink_tx_kib = parse_u64(v[2]);
    } else if (strcmp(key, "clock_events") == 0 && nv >= 1) {
        g->clock_events = parse_u64(v[0]);
    } else if (strcmp(key, "ecc") == 0 && nv >= 1) {
        g->ecc = parse_u64(v[0]);
    } else if (strcmp(key, "process") == 0 && nv >= 2) {
        add_proc(g->procs, &g->nprocs, v);
    } else if (strcmp(key, "graphics_process") == 0 && nv >= 2) {
        add_proc(g->graphics, &g->ngraphics, v);
    } else if (strcmp(key, "util_sample") == 0 && nv >= 4) {
        if (g->nsamples < MAX_SAMPLES) {
            struct sample *s = &g->samples[g->nsamples++];
            s->pid = (unsigned int)strtoul(v[0], NULL, 0);
            s->ts = parse_u64(v[1]);
            s->sm = (unsigned int)strtoul(v[2], NULL, 0);
            s->mem = (unsigned int)strtoul(v[3], NULL, 0);
        }
    } else if (strcmp(key, "unsupported") == 0 && nv >= 1) {
        add_name(g->unsupported, &g->nunsupported, v[0]);
    } else if (strcmp(key, "no_permission") == 0 && nv >= 1) {
        add_name(g->no_permission, &g->nno_permission, v[0]);
    } else if (strcmp(key, "lost") == 0 && nv >= 1) {
        g->lost = atoi(v[0]);
    } else if (strcmp(key, "gpm") == 0 && nv >= 2) {
        g->has_gpm = 1;
        g->gpm_sm = strtod(v[0], NULL);
        g->gpm_tensor = strtod(v[1], NULL);
    } else if (strcmp(key, "mig") == 0 && nv >= 1) {
        g->mig_enabled = atoi(v[0]);
    } else if (strcmp(key, "mig_instance") == 0 && nv >= 5) {
        int slot = atoi(v[0]);
        if (slot >= 0 && slot < MAX_MIG_DEVICES) {
            struct mig *m = &g->mig[slot];
            m->present = 1;
            copy_text(m->uuid, sizeof m->uuid, v[1]);
            copy_text(m->name, sizeof m->name, v[2]);
            m->total = parse_u64(v[3]);
            m->used = parse_u64(v[4]);
        }
    } else if (strcmp(key, "mig_process") == 0 && nv >= 3) {
        int slot = atoi(v[0]);
        if (slot >= 0 && slot < MAX_MIG_DEVICES) add_proc(g->mig[slot].procs, &g->mig[slot].nprocs, v + 1);
    } else if (strcmp(key, "cc") == 0 && nv >= 2) {
        g->cc_major = atoi(v[0]);
        g->cc_minor = atoi(v[1]);
    }
    /* unknown keys: ignored, so older libraries read newer scenario files */
}

static void scenario_parse(struct scenario *sc, char *text)
{
    memset(sc, 0, sizeof *sc);
    copy_text(sc->driver, sizeof sc->driver, "550.54.15");
    sc->cuda = 12040;
    for (int i = 0; i < MAX_GPUS; i++) {
        sc->gpus[i].cc_major = 9; /* an H100 is compute capability 9.0 */
        sc->gpus[i].cc_minor = 0;
    }
    for (char *line = text; line != NULL;) {
        char *next = strchr(line, '\n');
        if (next) *next++ = '\0';
        char *tok[24];
        int n = tokenize(line, tok, 24);
        if (n >= 2 && strcmp(tok[0], "driver") == 0) {
            copy_text(sc->driver, sizeof sc->driver, tok[1]);
        } else if (n >= 2 && strcmp(tok[0], "cuda") == 0) {
            sc->cuda = atoi(tok[1]);
        } else if (n >= 2 && strcmp(tok[0], "init_error") == 0) {
            sc->init_error = atoi(tok[1]);
        } else if (n >= 3 && strcmp(tok[0], "gpu") == 0) {
            int i = atoi(tok[1]);
            if (i >= 0 && i < MAX_GPUS) {
                if (i + 1 > sc->ngpus) sc->ngpus = i + 1;
                parse_gpu_line(&sc->gpus[i], tok + 2, n - 2);
            }
        }
        line = next;
    }
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* (Re)read the scenario when `path` is new or the file changed.  0: S is current; -1: the
 * file could not be read (S keeps what it had).  Called with `lock` held. */
static int scenario_refresh(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (loaded && strcmp(path, loaded_path) == 0 && same_file(&st, &loaded_stat)) return 0;

    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            char *bigger = realloc(text, cap * 2);
            if (!bigger) { free(text); text = NULL; break; }
            text = bigger;
            cap *= 2;
        }
    }
    fclose(f);
    if (!text) return -1;
    text[len] = '\0';

    struct scenario *fresh = malloc(sizeof *fresh);
    if (!fresh) { free(text); return -1; }
    scenario_parse(fresh, text);
    memcpy(&S, fresh, sizeof S);
    free(fresh);
    free(text);

    loaded = 1;
    if (path != loaded_path) copy_text(loaded_path, sizeof loaded_path, path);
    loaded_stat = st;
    return 0;
}

/* ---- call plumbing ----------------------------------------------------------------------- */

static nvmlReturn_t leave(nvmlReturn_t rc)
{
    pthread_mutex_unlock(&lock);
    return rc;
}

/* `listed` names a function and its versioned variants: "nvmlDeviceGetMemoryInfo" also covers
 * nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetTemperature" covers nvmlDeviceGetTemperatureV. */
static int listed(char list[][FN_LEN], int n, const char *fn)
{
    for (int i = 0; i < n; i++) {
        size_t len = strlen(list[i]);
        if (strncmp(fn, list[i], len) != 0) continue;
        const char *rest = fn + len;
        if (*rest == '\0' || strcmp(rest, "V") == 0) return 1;
        if (rest[0] == '_' && rest[1] == 'v' && rest[2] >= '0' && rest[2] <= '9') return 1;
    }
    return 0;
}

/* Takes the lock (released by leave()), counts the call, and checks, in the order real NVML
 * answers them: initialised, a valid handle, GPU not lost, function not refused for it.
 * `allow_mig`: whether a MIG device handle is accepted (others answer NOT_SUPPORTED). */
static nvmlReturn_t enter(const char *fn, const void *h, int allow_mig, struct gpu **g, struct mig **m)
{
    pthread_mutex_lock(&lock);
    count_call(fn);
    *g = NULL;
    *m = NULL;
    if (init_refcount == 0) return NVML_ERROR_UNINITIALIZED;

    const struct handle *hd = h;
    const char *gb = (const char *)gpu_handles, *mb = (const char *)mig_handles;
    const char *p = h;
    int is_gpu = p >= gb && p < gb + sizeof gpu_handles && (p - gb) % sizeof(struct handle) == 0;
    int is_mig = p >= mb && p < mb + sizeof mig_handles && (p - mb) % sizeof(struct handle) == 0;
    if (!is_gpu && !is_mig) return NVML_ERROR_INVALID_ARGUMENT;

    /* A handle of a GPU that the rewritten scenario no longer lists: it fell off the bus. */
    if (hd->gpu >= S.ngpus) return NVML_ERROR_GPU_IS_LOST;
    *g = &S.gpus[hd->gpu];
    if ((*g)->lost) return NVML_ERROR_GPU_IS_LOST;
    if (is_mig) {
        struct mig *mi = &(*g)->mig[hd->slot];
        if (!(*g)->mig_enabled || !mi->present) return NVML_ERROR_INVALID_ARGUMENT;
        *m = mi;
        if (!allow_mig) return NVML_ERROR_NOT_SUPPORTED;
    }
    if (listed((*g)->unsupported, (*g)->nunsupported, fn)) return NVML_ERROR_NOT_SUPPORTED;
    if (listed((*g)->no_permission, (*g)->nno_permission, fn)) return NVML_ERROR_NO_PERMISSION;
    return NVML_SUCCESS;
}

/* Function bodies start with one of these: a GPU handle only, or a GPU or MIG handle. */
#define ENTER_GPU(h)                                                    \
    struct gpu *g;                                                      \
    struct mig *m;                                                      \
    nvmlReturn_t rc_ = enter(__func__, (h), 0, &g, &m);                 \
    (void)m;                                                            \
    if (rc_ != NVML_SUCCESS) return leave(rc_)
#define ENTER_ANY(h)                                                    \
    struct gpu *g;                                                      \
    struct mig *m;                                                      \
    nvmlReturn_t rc_ = enter(__func__, (h), 1, &g, &m);                 \
    if (rc_ != NVML_SUCCESS) return leave(rc_)
/* For calls without a device: lock, count, require nvmlInit. */
#define ENTER_SYSTEM()                                                  \
    pthread_mutex_lock(&lock);                                          \
    count_call(__func__);                                               \
    if (init_refcount == 0) return leave(NVML_ERROR_UNINITIALIZED)

static nvmlReturn_t put_string(char *dst, unsigned int len, const char *src)
{
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (len < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static int gpu_index(const struct gpu *g) { return (int)(g - S.gpus); }

/* ---- extra exports for tests ------------------------------------------------------------- */

/* How many times the named NVML function has been called (all outcomes) since load/reset. */
EXPORT unsigned long long standin_calls(const char *name)
{
    unsigned long long n = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_COUNTED && counters[i].name; i++)
        if (name && strcmp(counters[i].name, name) == 0) n = counters[i].n;
    pthread_mutex_unlock(&lock);
    return n;
}

/* Forget counts and initialisations, as if the library had just been loaded. */
EXPORT void standin_reset(void)
{
    pthread_mutex_lock(&lock);
    memset(counters, 0, sizeof counters);
    init_refcount = 0;
    loaded = 0;
    pthread_mutex_unlock(&lock);
}

/* ---- init / shutdown / errors ------------------------------------------------------------ */

__attribute__((constructor)) static void setup_handles(void)
{
    for (int i = 0; i < MAX_GPUS; i++) {
        gpu_handles[i].gpu = i;
        gpu_handles[i].slot = -1;
        for (int s = 0; s < MAX_MIG_DEVICES; s++) {
            mig_handles[i][s].gpu = i;
            mig_handles[i][s].slot = s;
        }
    }
}

static nvmlReturn_t do_init(const char *fn)
{
    pthread_mutex_lock(&lock);
    count_call(fn);
    const char *path = getenv("GPUTOP_NVML_STANDIN");
    /* No scenario: behave like a machine without the NVIDIA kernel driver. */
    if (path == NULL || *path == '\0') return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    if (scenario_refresh(path) != 0 && !(loaded && strcmp(path, loaded_path) == 0)) {
        fprintf(stderr, "NVML stand-in: cannot read the scenario %s (GPUTOP_NVML_STANDIN)\n", path);
        return leave(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    if (S.init_error != 0) return leave(S.init_error);
    init_refcount++;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlInit
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(__func__); }
#endif

#ifndef OMIT_nvmlInit_v2
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(__func__); }
#endif

#ifndef OMIT_nvmlInitWithFlags
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return do_init(__func__);
}
#endif

#ifndef OMIT_nvmlShutdown
EXPORT nvmlReturn_t nvmlShutdown(void)
{
    ENTER_SYSTEM();
    init_refcount--;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlErrorString
/* The texts pynvml itself uses in NVMLError._errcode_to_string. */
EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}
#endif

/* ---- system queries ---------------------------------------------------------------------- */

#ifndef OMIT_nvmlSystemGetDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    ENTER_SYSTEM();
    return leave(put_string(version, length, S.driver));
}
#endif

#ifndef OMIT_nvmlSystemGetNVMLVersion
/* The NVML version is the CUDA major version before the driver version: "12.550.127.08" for
 * driver 550.127.08 (as quoted in nvitop PR #226's runtime environment). */
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    ENTER_SYSTEM();
    char text[96];
    snprintf(text, sizeof text, "%d.%s", S.cuda / 1000, S.driver);
    return leave(put_string(version, length, text));
}
#endif

static nvmlReturn_t cuda_version(const char *fn, int *v)
{
    pthread_mutex_lock(&lock);
    count_call(fn);
    if (init_refcount == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *v = S.cuda;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlSystemGetCudaDriverVersion
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return cuda_version(__func__, v); }
#endif

#ifndef OMIT_nvmlSystemGetCudaDriverVersion_v2
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return cuda_version(__func__, v); }
#endif

static nvmlReturn_t device_count(const char *fn, unsigned int *count)
{
    pthread_mutex_lock(&lock);
    count_call(fn);
    if (init_refcount == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    scenario_refresh(loaded_path); /* the test may have rewritten the file; unreadable: keep */
    *count = (unsigned int)S.ngpus;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetCount
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return device_count(__func__, count); }
#endif

#ifndef OMIT_nvmlDeviceGetCount_v2
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return device_count(__func__, count); }
#endif

static nvmlReturn_t handle_by_index(const char *fn, unsigned int index, void **device)
{
    pthread_mutex_lock(&lock);
    count_call(fn);
    if (init_refcount == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (!device || index >= (unsigned int)S.ngpus) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (S.gpus[index].lost) return leave(NVML_ERROR_GPU_IS_LOST);
    *device = &gpu_handles[index];
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetHandleByIndex
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device)
{
    return handle_by_index(__func__, index, device);
}
#endif

#ifndef OMIT_nvmlDeviceGetHandleByIndex_v2
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device)
{
    return handle_by_index(__func__, index, device);
}
#endif

/* ---- identity ---------------------------------------------------------------------------- */

#ifndef OMIT_nvmlDeviceGetUUID
EXPORT nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length)
{
    ENTER_ANY(device);
    return leave(put_string(uuid, length, m ? m->uuid : g->uuid));
}
#endif

#ifndef OMIT_nvmlDeviceGetName
EXPORT nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length)
{
    ENTER_ANY(device);
    return leave(put_string(name, length, m ? m->name : g->name));
}
#endif

#ifndef OMIT_nvmlDeviceGetIndex
EXPORT nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index)
{
    ENTER_GPU(device);
    if (!index) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned int)gpu_index(g);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPciInfo_v3
/* Bus ids: 18 and 2A are GPUs 0 and 1 of an 8x H100 SXM server in nvidia-smi output quoted in
 * NVIDIA/nccl issue #1264; the rest are illustrative.  Device id 0x2330 (H100 SXM5 80GB) with
 * vendor 0x10DE is illustrative too. */
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci)
{
    static const unsigned int buses[8] = {0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB};
    ENTER_GPU(device);
    if (!pci) return leave(NVML_ERROR_INVALID_ARGUMENT);
    int i = gpu_index(g);
    memset(pci, 0, sizeof *pci);
    pci->domain = (unsigned int)(i / 8); /* beyond eight GPUs: the next PCI domain */
    pci->bus = buses[i % 8];
    pci->device = 0;
    pci->pciDeviceId = 0x233010DEu;
    pci->pciSubSystemId = 0x16C110DEu;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:00.0", pci->domain, pci->bus);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:00.0", pci->domain, pci->bus);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetCudaComputeCapability
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor)
{
    ENTER_ANY(device);
    if (!major || !minor) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *major = g->cc_major;
    *minor = g->cc_minor;
    return leave(NVML_SUCCESS);
}
#endif

/* ---- utilisation, memory, power, temperature, clocks ------------------------------------- */

#ifndef OMIT_nvmlDeviceGetUtilizationRates
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util)
{
    ENTER_ANY(device);
    /* nvml.h: utilisation rates are not supported on MIG-enabled GPUs; nvidia-smi shows
     * GPU-Util "N/A" for an H100 with MIG on (NVIDIA/DCGM issue #91). */
    if (m || g->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!util) return leave(NVML_ERROR_INVALID_ARGUMENT);
    util->gpu = g->util_gpu;
    util->memory = g->util_mem;
    return leave(NVML_SUCCESS);
}
#endif

/* Memory: the scenario gives total, reserved and used.  Since R510, v1's `used` includes the
 * memory the driver reserves and v2 reports it apart (nvml.h's nvmlMemory_v2_t; rust-nvml
 * nvml-wrapper issue #57: an idle A100 showed 912 MB used through v1 and 7.8 MB through v2,
 * the latter matching nvidia-smi).  `free` is the same in both. */
static void memory_figures(const struct gpu *g, const struct mig *m, unsigned long long *total,
                           unsigned long long *reserved, unsigned long long *used)
{
    if (m) {
        *total = m->total;
        *reserved = 0;
        *used = m->used;
    } else {
        *total = g->mem_total;
        *reserved = g->mem_reserved;
        *used = g->mem_used;
    }
}

static unsigned long long minus(unsigned long long a, unsigned long long b) { return a > b ? a - b : 0; }

#ifndef OMIT_nvmlDeviceGetMemoryInfo
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
    ENTER_ANY(device);
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, reserved, used;
    memory_figures(g, m, &total, &reserved, &used);
    memory->total = total;
    memory->used = used + reserved;
    memory->free = minus(total, used + reserved);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMemoryInfo_v2
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory)
{
    ENTER_ANY(device);
    if (!memory) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != NVML_MEMORY_V2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, reserved, used;
    memory_figures(g, m, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = minus(total, used + reserved);
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPowerUsage
EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *mw)
{
    ENTER_GPU(device);
    if (!mw) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *mw = g->power_mw;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetEnforcedPowerLimit
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *device, unsigned int *mw)
{
    ENTER_GPU(device);
    if (!mw) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *mw = g->power_limit_mw;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperature
EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp)
{
    ENTER_GPU(device);
    if (!temp || sensor != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp_c;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetTemperatureV
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(void *device, nvmlTemperature_v1_t *temp)
{
    ENTER_GPU(device);
    if (!temp) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (temp->version != NVML_TEMPERATURE_V1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (temp->sensorType != NVML_TEMPERATURE_GPU) return leave(NVML_ERROR_INVALID_ARGUMENT);
    temp->temperature = (int)g->temp_c;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetClockInfo
/* GRAPHICS answers the SM clock (the stand-in's choice); VIDEO is not modelled. */
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(void *device, int type, unsigned int *mhz)
{
    ENTER_GPU(device);
    if (!mhz) return leave(NVML_ERROR_INVALID_ARGUMENT);
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *mhz = g->sm_mhz; return leave(NVML_SUCCESS);
    case NVML_CLOCK_MEM: *mhz = g->mem_mhz; return leave(NVML_SUCCESS);
    case NVML_CLOCK_VIDEO: return leave(NVML_ERROR_NOT_SUPPORTED);
    default: return leave(NVML_ERROR_INVALID_ARGUMENT);
    }
}
#endif

static nvmlReturn_t clock_reasons(void *device, const char *fn, unsigned long long *reasons)
{
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t rc = enter(fn, device, 0, &g, &m);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!reasons) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = g->clock_events;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *device, unsigned long long *reasons)
{
    return clock_reasons(device, __func__, reasons);
}
#endif

#ifndef OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *device, unsigned long long *reasons)
{
    return clock_reasons(device, __func__, reasons);
}
#endif

#ifndef OMIT_nvmlDeviceGetTotalEccErrors
/* Every (error type, counter type) pair answers the scenario's one `ecc` count. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(void *device, int errorType, int counterType,
                                                unsigned long long *count)
{
    ENTER_GPU(device);
    if (!count || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = g->ecc;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetPcieThroughput
/* KB/s over a short window.  NVML's documentation says the counter is measured over a 20 ms
 * interval, so the call blocks that long; the scenario's pcie_delay_ms models it.  The lock is
 * released before sleeping, so other threads' calls are not held up. */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned int *value)
{
    ENTER_GPU(device);
    if (!value) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int kib;
    if (counter == NVML_PCIE_UTIL_TX_BYTES) kib = g->pcie_tx_kib_s;
    else if (counter == NVML_PCIE_UTIL_RX_BYTES) kib = g->pcie_rx_kib_s;
    else return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int delay_ms = g->pcie_delay_ms;
    pthread_mutex_unlock(&lock);

    struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    *value = kib;
    return NVML_SUCCESS;
}
#endif

/* ---- processes --------------------------------------------------------------------------- */

struct entry { unsigned int pid; unsigned long long bytes; unsigned int gi, ci; };

/* The processes a handle lists.  A MIG device lists its own (compute) processes; a GPU lists
 * its `process` lines and, when MIG is on, every MIG device's processes with gpuInstanceId =
 * slot, computeInstanceId = 0 (nvidia-smi's process table on a MIG GPU has GI/CI columns; the
 * id numbering here is the stand-in's simplification).  MIG devices run no graphics. */
static int collect(const struct gpu *g, const struct mig *m, int graphics, struct entry *out)
{
    int n = 0;
    if (m) {
        if (graphics) return 0;
        for (int i = 0; i < m->nprocs; i++)
            out[n++] = (struct entry){m->procs[i].pid, m->procs[i].bytes, (unsigned int)(m - g->mig), 0};
        return n;
    }
    const struct proc *list = graphics ? g->graphics : g->procs;
    int count = graphics ? g->ngraphics : g->nprocs;
    for (int i = 0; i < count; i++)
        out[n++] = (struct entry){list[i].pid, list[i].bytes, NO_INSTANCE_ID, NO_INSTANCE_ID};
    if (!graphics && g->mig_enabled)
        for (int s = 0; s < MAX_MIG_DEVICES; s++)
            for (int i = 0; g->mig[s].present && i < g->mig[s].nprocs; i++)
                out[n++] = (struct entry){g->mig[s].procs[i].pid, g->mig[s].procs[i].bytes, (unsigned int)s, 0};
    return n;
}

/* Real NVML's two-call protocol (nvml.h, nvmlDeviceGetComputeRunningProcesses): with infos NULL
 * or *count too small it sets *count to the number needed and answers INSUFFICIENT_SIZE; with no
 * processes it answers SUCCESS and *count = 0.  `stride` is the entry size the version writes. */
static nvmlReturn_t list_processes(void *device, const char *fn, int graphics, unsigned int *count,
                                   void *infos, size_t stride)
{
    static struct entry found[MAX_PROCS * (MAX_MIG_DEVICES + 1)]; /* guarded by `lock` */
    struct gpu *g;
    struct mig *m;
    nvmlReturn_t rc = enter(fn, device, 1, &g, &m);
    if (rc != NVML_SUCCESS) return leave(rc);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = (unsigned int)collect(g, m, graphics, found);
    if (n == 0) {
        *count = 0;
        return leave(NVML_SUCCESS);
    }
    if (infos == NULL || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned int i = 0; i < n; i++) {
        /* Built in a zeroed r535 entry (padding included), then its first `stride` bytes are
         * copied: the v1/v2/r535 layouts share their leading fields' offsets except v1, which
         * is pid + usedGpuMemory only, the same first 16 bytes. */
        nvmlProcessInfo_r535_t e;
        memset(&e, 0, sizeof e);
        e.pid = found[i].pid;
        e.usedGpuMemory = found[i].bytes;
        e.gpuInstanceId = found[i].gi;
        e.computeInstanceId = found[i].ci;
        memcpy((char *)infos + i * stride, &e, stride);
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 0, count, infos, sizeof(nvmlProcessInfo_v1_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 0, count, infos, sizeof(nvmlProcessInfo_v2_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 0, count, infos, PROCINFO_V3_SIZE);
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 1, count, infos, sizeof(nvmlProcessInfo_v1_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v2
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 1, count, infos, sizeof(nvmlProcessInfo_v2_t));
}
#endif

#ifndef OMIT_nvmlDeviceGetGraphicsRunningProcesses_v3
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count, void *infos)
{
    return list_processes(device, __func__, 1, count, infos, PROCINFO_V3_SIZE);
}
#endif

#ifndef OMIT_nvmlDeviceGetProcessUtilization
/* Samples newer than lastSeenTimeStamp (µs).  nvml.h: call with utilization NULL to learn the
 * count; NOT_FOUND when there are no sample entries. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(void *device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *count, unsigned long long lastSeenTimeStamp)
{
    ENTER_GPU(device);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned int n = 0;
    for (int i = 0; i < g->nsamples; i++)
        if (g->samples[i].ts > lastSeenTimeStamp) n++;
    if (n == 0) {
        *count = 0;
        return leave(NVML_ERROR_NOT_FOUND);
    }
    if (utilization == NULL || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (int i = 0; i < g->nsamples; i++) {
        const struct sample *s = &g->samples[i];
        if (s->ts <= lastSeenTimeStamp) continue;
        nvmlProcessUtilizationSample_t x;
        memset(&x, 0, sizeof x);
        x.pid = s->pid;
        x.timeStamp = s->ts;
        x.smUtil = s->sm;
        x.memUtil = s->mem;
        memcpy(&utilization[k++], &x, sizeof x);
    }
    *count = n;
    return leave(NVML_SUCCESS);
}
#endif

/* ---- field values ------------------------------------------------------------------------ */

static void field_value(const struct gpu *g, nvmlFieldValue_t *v, long long stamp)
{
    unsigned long long value = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    switch (v->fieldId) {
    case FI_PCIE_COUNT_TX_BYTES:
    case FI_PCIE_COUNT_RX_BYTES:
        /* old drivers (e.g. R470) have no PCIe byte counters: NOT_SUPPORTED per field */
        if (!g->has_pcie_bytes || g->pcie_counters_unsupported) rc = NVML_ERROR_NOT_SUPPORTED;
        else value = v->fieldId == FI_PCIE_COUNT_TX_BYTES ? g->pcie_tx_bytes : g->pcie_rx_bytes;
        break;
    case FI_NVLINK_LINK_COUNT:
        if (!g->has_nvlink) rc = NVML_ERROR_NOT_SUPPORTED;
        else value = g->nvlink_links;
        break;
    case FI_NVLINK_THROUGHPUT_DATA_TX:
    case FI_NVLINK_THROUGHPUT_DATA_RX: {
        /* scopeId is the link; UINT_MAX asks for the sum over all links */
        unsigned long long total = v->fieldId == FI_NVLINK_THROUGHPUT_DATA_TX ? g->nvlink_tx_kib : g->nvlink_rx_kib;
        if (!g->has_nvlink || g->nvlink_links == 0) rc = NVML_ERROR_NOT_SUPPORTED;
        else if (v->scopeId == UINT_MAX) value = total;
        else if (v->scopeId < g->nvlink_links) value = total / g->nvlink_links;
        else rc = NVML_ERROR_INVALID_ARGUMENT;
        break;
    }
    default:
        rc = NVML_ERROR_NOT_SUPPORTED;
    }
    v->timestamp = stamp;
    v->latencyUsec = 0;
    v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    v->nvmlReturn = rc;
    v->value.ullVal = value;
}

#ifndef OMIT_nvmlDeviceGetFieldValues
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(void *device, int valuesCount, nvmlFieldValue_t *values)
{
    ENTER_GPU(device);
    if (valuesCount <= 0 || !values) return leave(NVML_ERROR_INVALID_ARGUMENT);
    long long stamp = now_us();
    for (int i = 0; i < valuesCount; i++) field_value(g, &values[i], stamp);
    return leave(NVML_SUCCESS);
}
#endif

/* ---- MIG --------------------------------------------------------------------------------- */

#ifndef OMIT_nvmlDeviceGetMigMode
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void *device, unsigned int *current, unsigned int *pending)
{
    ENTER_GPU(device);
    if (!current || !pending) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = g->mig_enabled ? 1 : 0;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMaxMigDeviceCount
/* nvml.h: the count "returns zero if MIG is not supported or enabled". */
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *device, unsigned int *count)
{
    ENTER_GPU(device);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = g->mig_enabled ? MAX_MIG_DEVICES : 0;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetMigDeviceHandleByIndex
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, void **migDevice)
{
    ENTER_GPU(device);
    if (!migDevice) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig_enabled) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (index >= MAX_MIG_DEVICES) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->mig[index].present) return leave(NVML_ERROR_NOT_FOUND);
    *migDevice = &mig_handles[gpu_index(g)][index];
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceIsMigDeviceHandle
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *device, unsigned int *isMigDevice)
{
    ENTER_ANY(device);
    if (!isMigDevice) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *isMigDevice = m != NULL;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlDeviceGetDeviceHandleFromMigDeviceHandle
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *migDevice, void **device)
{
    ENTER_ANY(migDevice);
    if (!device || !m) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *device = &gpu_handles[gpu_index(g)];
    return leave(NVML_SUCCESS);
}
#endif

/* ---- GPM (GPU performance monitoring, Hopper and later) ---------------------------------- */

/* Samples are tracked in a list so a foreign or freed pointer is refused, not dereferenced. */
struct gpm_sample { struct gpm_sample *next; int gpu; int taken; };
static struct gpm_sample *gpm_samples;

static struct gpm_sample *gpm_find(const void *p)
{
    for (struct gpm_sample *s = gpm_samples; s; s = s->next)
        if (s == p) return s;
    return NULL;
}

#ifndef OMIT_nvmlGpmQueryDeviceSupport
EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(void *device, nvmlGpmSupport_t *support)
{
    ENTER_GPU(device);
    if (!support) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (support->version != NVML_GPM_SUPPORT_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = g->has_gpm ? 1 : 0;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleAlloc
EXPORT nvmlReturn_t nvmlGpmSampleAlloc(void **sample)
{
    ENTER_SYSTEM();
    if (!sample) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct gpm_sample *s = calloc(1, sizeof *s);
    if (!s) return leave(NVML_ERROR_MEMORY);
    s->gpu = -1;
    s->next = gpm_samples;
    gpm_samples = s;
    *sample = s;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmSampleFree
EXPORT nvmlReturn_t nvmlGpmSampleFree(void *sample)
{
    ENTER_SYSTEM();
    for (struct gpm_sample **at = &gpm_samples; *at; at = &(*at)->next) {
        if (*at == sample) {
            struct gpm_sample *s = *at;
            *at = s->next;
            free(s);
            return leave(NVML_SUCCESS);
        }
    }
    return leave(NVML_ERROR_INVALID_ARGUMENT);
}
#endif

#ifndef OMIT_nvmlGpmSampleGet
EXPORT nvmlReturn_t nvmlGpmSampleGet(void *device, void *sample)
{
    ENTER_GPU(device);
    struct gpm_sample *s = gpm_find(sample);
    if (!s) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->has_gpm) return leave(NVML_ERROR_NOT_SUPPORTED);
    s->gpu = gpu_index(g);
    s->taken = 1;
    return leave(NVML_SUCCESS);
}
#endif

#ifndef OMIT_nvmlGpmMetricsGet
/* Each metric answers on its own (metrics[i].nvmlReturn); the scenario gives SM utilisation
 * (metric 2) and any-tensor utilisation (metric 5), others answer NOT_SUPPORTED.  The metric
 * names filled in are the stand-in's own. */
EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg)
{
    ENTER_SYSTEM();
    if (!mg) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (mg->version != NVML_GPM_METRICS_GET_VERSION) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (mg->numMetrics > NVML_GPM_METRIC_MAX) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct gpm_sample *a = gpm_find(mg->sample1), *b = gpm_find(mg->sample2);
    if (!a || !b || !a->taken || !b->taken || a->gpu != b->gpu) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (a->gpu >= S.ngpus || S.gpus[a->gpu].lost) return leave(NVML_ERROR_GPU_IS_LOST);
    const struct gpu *g = &S.gpus[a->gpu];
    for (unsigned int i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *x = &mg->metrics[i];
        x->nvmlReturn = NVML_SUCCESS;
        if (x->metricId == GPM_METRIC_SM_UTIL) {
            x->value = g->gpm_sm;
            x->metricInfo = (nvmlGpmMetricInfo_t){"sm_util", "SM utilization", "%"};
        } else if (x->metricId == GPM_METRIC_ANY_TENSOR_UTIL) {
            x->value = g->gpm_tensor;
            x->metricInfo = (nvmlGpmMetricInfo_t){"any_tensor_util", "Any tensor pipe utilization", "%"};
        } else {
            x->value = 0;
            x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            x->metricInfo = (nvmlGpmMetricInfo_t){NULL, NULL, NULL};
        }
    }
    return leave(NVML_SUCCESS);
}
#endif
