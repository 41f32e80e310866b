// A QEMU TCG plugin that counts the guest instructions an aarch64 process executes, by kind.
//
// The kind of an instruction is its mnemonic and the shape of its first operand, found once
// when a block is translated: "fmla .8h" (8 half lanes), "fmla .4s", "fmadd h" (one half),
// "fmlal .4s", "bfdot .4s", "ldr q", "add x". Half-precision and bfloat16 instructions are
// decoded from their encoding, the others read off QEMU's disassembly. Each executed instruction
// adds one to its kind's counter inline (no callback), so the count is exact and costs little.
//
// At the exit of each guest process the counts are written to "<out>.<pid>", one
// "count<TAB>kind" line each. A process forked by an aarch64 guest (the RPC server forks one per
// session) starts from zero, so its file holds its own work only. Count one thread: inline adds
// are not atomic (QEMU 7.2 has no per-CPU scoreboards).
//
//   qemu-aarch64 -plugin libinsn_count.so,out=/tmp/counts ./program
//
// Built by scripts/arm/setup_emulator.sh against the qemu-plugin.h of Debian's QEMU source.
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define KIND_LEN 32
#define SLOTS 16384  // open addressing; an aarch64 program uses a few hundred kinds

typedef struct {
    char kind[KIND_LEN];
    uint64_t count;
} Slot;

static Slot slots[SLOTS];
static int used;

// With "blocks=1": each translated block's executions too, written with its host address and
// the process's memory map, so that a count can be laid on the functions of a library
// (scripts/arm_kernel_counts.py).
typedef struct Block {
    uint64_t count;
    uint64_t host;
    uint32_t insns;
    struct Block *next;
} Block;

static int by_block;
static Block *blocks;

// The file mappings seen so far: a library may be unloaded before the process exits, so the
// map is read again whenever a block lies outside every range known.
typedef struct Mapping {
    uint64_t low, high;
    char line[512];
    struct Mapping *next;
} Mapping;

static Mapping *mappings;

static int mapped(uint64_t host) {
    for (Mapping *m = mappings; m; m = m->next)
        if (m->low <= host && host < m->high) return 1;
    return 0;
}

static void read_maps(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long long low, high;
        if (sscanf(line, "%llx-%llx", &low, &high) != 2 || !strchr(line, '/')) continue;
        int known = 0;
        for (Mapping *m = mappings; m && !known; m = m->next)
            known = m->low == low && strcmp(m->line, line) == 0;
        if (known) continue;
        Mapping *m = calloc(1, sizeof *m);
        if (!m) break;
        m->low = low;
        m->high = high;
        snprintf(m->line, sizeof m->line, "%s", line);
        m->next = mappings;
        mappings = m;
    }
    if (maps) fclose(maps);
}
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char out_prefix[4096];

#define AARCH64_CLONE 220  // glibc's fork() on aarch64
#define CLONE_VM 0x100     // set for a thread, clear for a new process
#define MAX_VCPUS 1024
static uint64_t clone_flags[MAX_VCPUS];

// "fmla v0.8h, v1.8h, v2.h[3]" -> "fmla .8h"; "fmadd h0, h1, h2, h3" -> "fmadd h";
// "ldr q0, [x1, #16]" -> "ldr q"; "ret" -> "ret"
static void kind_of(const char *disas, char *kind) {
    const char *p = disas;
    while (*p == ' ') p++;
    int n = 0;
    while (*p && *p != ' ' && *p != '\t' && n < 16) kind[n++] = *p++;
    while (*p == ' ' || *p == '\t') p++;
    if (*p && n < KIND_LEN - 8) {
        kind[n++] = ' ';
        const char *dot = NULL;
        for (const char *q = p; *q && *q != ','; q++) {
            if (*q == '.') { dot = q; break; }
        }
        if (dot && (isdigit((unsigned char)dot[1]) || isalpha((unsigned char)dot[1]))) {
            for (const char *q = dot; *q && *q != ',' && *q != ' ' && *q != '[' && *q != '}'
                 && n < KIND_LEN - 1; q++) {
                kind[n++] = *q;
            }
        } else if (isalpha((unsigned char)*p)) {
            kind[n++] = *p;  // the register file: x, w, h, s, d, q, b, v
        } else {
            n--;  // an immediate or a label: the mnemonic alone
        }
    }
    kind[n] = '\0';
}

// The half-precision and bfloat16 instructions, decoded from their encoding: the capstone 4 that
// Debian's QEMU 7.2 disassembles with predates them and prints ".byte".
static const char *const SAME_FP16[2][2][8] = {  // [U][a][opcode]: three registers, FP16
    {{"fmaxnm", "fmla", "fadd", "fmulx", "fcmeq", NULL, "fmax", "frecps"},
     {"fminnm", "fmls", "fsub", NULL, NULL, NULL, "fmin", "frsqrts"}},
    {{"fmaxnmp", NULL, "faddp", "fmul", "fcmge", "facge", "fmaxp", "fdiv"},
     {"fminnmp", NULL, "fabd", NULL, "fcmgt", "facgt", "fminp", NULL}}};
static const char *const SCALAR_FP16[9] = {"fmul", "fdiv", "fadd", "fsub", "fmax", "fmin",
                                           "fmaxnm", "fminnm", "fnmul"};
static const char *const FMADD[4] = {"fmadd", "fmsub", "fnmadd", "fnmsub"};

static int decode(uint32_t w, char *kind) {
    const char *q8 = (w >> 30) & 1 ? ".8h" : ".4h";
    const char *q4 = (w >> 30) & 1 ? ".4s" : ".2s";
    if ((w & 0xFFC00000) == 0x1FC00000) {  // FMADD and kin, half
        snprintf(kind, KIND_LEN, "%s h", FMADD[((w >> 20) & 2) | ((w >> 15) & 1)]);
    } else if ((w & 0xFFE00C00) == 0x1EE00800 && ((w >> 12) & 15) < 9) {
        snprintf(kind, KIND_LEN, "%s h", SCALAR_FP16[(w >> 12) & 15]);
    } else if ((w & 0x9F60C400) == 0x0E400400
               && SAME_FP16[(w >> 29) & 1][(w >> 23) & 1][(w >> 11) & 7]) {
        snprintf(kind, KIND_LEN, "%s %s", SAME_FP16[(w >> 29) & 1][(w >> 23) & 1][(w >> 11) & 7],
                 q8);
    } else if ((w & 0xBFC0B400) == 0x0F001000) {  // FMLA, FMLS by element, half
        snprintf(kind, KIND_LEN, "%s %s", (w >> 14) & 1 ? "fmls" : "fmla", q8);
    } else if ((w & 0x9F60DC00) == 0x0E20CC00 && ((w >> 29) & 1) != ((w >> 13) & 1)) {
        // FMLAL, FMLSL (vector): U=0 opcode 11101, U=1 opcode 11001
        snprintf(kind, KIND_LEN, "%s%s %s", (w >> 23) & 1 ? "fmlsl" : "fmlal",
                 (w >> 29) & 1 ? "2" : "", q4);
    } else if ((w & 0x9FC03400) == 0x0F800000 && ((w >> 29) & 1) == ((w >> 15) & 1)) {
        // FMLAL, FMLSL by element: U=0 opcode 0x00, U=1 opcode 1x00 (the others are MUL, MLA)
        snprintf(kind, KIND_LEN, "%s%s %s", (w >> 14) & 1 ? "fmlsl" : "fmlal",
                 (w >> 15) & 1 ? "2" : "", q4);
    } else if ((w & 0xBFE0FC00) == 0x2E40FC00 || (w & 0xBFC0F400) == 0x0F40F000) {
        snprintf(kind, KIND_LEN, "bfdot %s", q4);
    } else if ((w & 0xFFE0FC00) == 0x6E40EC00) {
        snprintf(kind, KIND_LEN, "bfmmla .4s");
    } else if ((w & 0xBFE0FC00) == 0x2EC0FC00) {
        snprintf(kind, KIND_LEN, "%s .4s", (w >> 30) & 1 ? "bfmlalt" : "bfmlalb");
    } else if ((w & 0xFFFFFC00) == 0x1E634000) {
        snprintf(kind, KIND_LEN, "bfcvt h");
    } else if ((w & 0xBFFFFC00) == 0x0EA16800) {
        snprintf(kind, KIND_LEN, "bfcvtn%s %s", (w >> 30) & 1 ? "2" : "", q8);
    } else {
        return 0;
    }
    return 1;
}

static uint64_t *counter(const char *kind) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *c = kind; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
    for (size_t i = 0; i < SLOTS; i++) {
        Slot *slot = &slots[(h + i) % SLOTS];
        if (slot->kind[0] == '\0') {
            if (used >= SLOTS - 1) break;
            memcpy(slot->kind, kind, strlen(kind) + 1);  // kind_of keeps it < KIND_LEN
            used++;
            return &slot->count;
        }
        if (strcmp(slot->kind, kind) == 0) return &slot->count;
    }
    return &slots[0].count;  // unreachable in practice: the table holds SLOTS - 1 kinds
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    size_t n = qemu_plugin_tb_n_insns(tb);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        char kind[KIND_LEN];
        uint32_t word = 0;
        if (qemu_plugin_insn_size(insn) == 4) memcpy(&word, qemu_plugin_insn_data(insn), 4);
        if (!decode(word, kind)) {
            char *disas = qemu_plugin_insn_disas(insn);
            kind_of(disas ? disas : "?", kind);
            free(disas);  // g_free is free since GLib 2.46
        }
        qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64,
                                                   counter(kind), 1);
    }
    if (by_block && n) {
        Block *block = calloc(1, sizeof *block);
        if (block) {
            block->host = (uint64_t)(uintptr_t)qemu_plugin_insn_haddr(
                qemu_plugin_tb_get_insn(tb, 0));
            if (!mapped(block->host)) read_maps();
            block->insns = (uint32_t)n;
            block->next = blocks;
            blocks = block;
            qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64,
                                                     &block->count, 1);
        }
    }
    pthread_mutex_unlock(&lock);
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1,
                       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
                       uint64_t a7, uint64_t a8) {
    if (num == AARCH64_CLONE && vcpu < MAX_VCPUS) clone_flags[vcpu] = a1;
}

static void on_syscall_return(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, int64_t ret) {
    if (num == AARCH64_CLONE && ret == 0 && vcpu < MAX_VCPUS && !(clone_flags[vcpu] & CLONE_VM)) {
        for (size_t i = 0; i < SLOTS; i++) slots[i].count = 0;  // the forked child's own work
        for (Block *block = blocks; block; block = block->next) block->count = 0;
    }
}

static void write_counts(qemu_plugin_id_t id, void *data) {
    char path[4200];
    snprintf(path, sizeof path, "%s.%d", out_prefix, (int)getpid());
    FILE *file = fopen(path, "w");
    if (!file) return;
    for (size_t i = 0; i < SLOTS; i++) {
        if (slots[i].kind[0] && slots[i].count)
            fprintf(file, "%llu\t%s\n", (unsigned long long)slots[i].count, slots[i].kind);
    }
    fclose(file);
    if (!by_block) return;
    snprintf(path, sizeof path, "%s.%d.blocks", out_prefix, (int)getpid());
    file = fopen(path, "w");
    if (!file) return;
    for (Block *block = blocks; block; block = block->next) {
        if (block->count)
            fprintf(file, "%llu\t%u\t%llx\n", (unsigned long long)block->count, block->insns,
                    (unsigned long long)block->host);
    }
    for (Mapping *m = mappings; m; m = m->next) fprintf(file, "map\t%s", m->line);
    fclose(file);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            strncpy(out_prefix, argv[i] + 4, sizeof out_prefix - 1);
        } else if (strcmp(argv[i], "blocks=1") == 0) {
            by_block = 1;
        }
    }
    if (!out_prefix[0]) {
        fprintf(stderr, "insn_count: give the output prefix, -plugin libinsn_count.so,out=PATH\n");
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    if (strcmp(info->target_name, "aarch64") == 0) {
        qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
        qemu_plugin_register_vcpu_syscall_ret_cb(id, on_syscall_return);
    }
    qemu_plugin_register_atexit_cb(id, write_counts, NULL);
    return 0;
}
