/* torch's CPU generator (mt19937) and the draws of its samplers, replayed
 * without torch (NOTE [torch replay] in docs/design.md).  The generator is
 * the standard MT19937 of at::mt19937 (aten/src/ATen/core/MT19937RNGEngine.h);
 * the draws are those of torch's CPU kernels, which tiering/clairvoyant/
 * torchrng.py checks the installed version of torch for.  The state is 624
 * words and the index of the next one (625 uint32, owned by Python). */
#include <stdint.h>

#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t s[MT_N];
    uint32_t i;                /* next word of s; MT_N: twist first */
} tr_mt;

void tr_seed(tr_mt *g, uint64_t seed)
{
    g->s[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < MT_N; j++)
        g->s[j] = 1812433253u * (g->s[j - 1] ^ (g->s[j - 1] >> 30)) + j;
    g->i = MT_N;
}

static void twist(tr_mt *g)
{
    for (int k = 0; k < MT_N; k++) {
        uint32_t y = (g->s[k] & 0x80000000u) | (g->s[(k + 1) % MT_N] & 0x7fffffffu);
        g->s[k] = g->s[(k + MT_M) % MT_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    g->i = 0;
}

static inline uint32_t next32(tr_mt *g)
{
    if (g->i >= MT_N)
        twist(g);
    uint32_t y = g->s[g->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* consume `words` 32-bit words: whole twists skip their tempering */
void tr_skip(tr_mt *g, int64_t words)
{
    while (words > 0) {
        if (g->i >= MT_N)
            twist(g);
        int64_t left = MT_N - g->i;
        int64_t take = words < left ? words : left;
        g->i += (uint32_t)take;
        words -= take;
    }
}

/* torch.randperm(n) for n < 2**32 / 20 (randperm_cpu): identity, then for
 * i < n - 1 swap r[i] with r[i + random() % (n - i)] */
#define TR_AHEAD 16   /* swaps whose random entry is asked for ahead (a power of 2) */

void tr_randperm(tr_mt *g, int64_t n, int64_t *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    /* the draws do not depend on the entries: those TR_AHEAD swaps on are
     * drawn first and their entries (cache misses on a large n) asked for,
     * so that the misses overlap; n - i < 2**32, a 32-bit division */
    int64_t z[TR_AHEAD];
    int64_t last = n - 1, drawn = 0;
    for (; drawn < last && drawn < TR_AHEAD; drawn++) {
        z[drawn] = drawn + (int64_t)(next32(g) % (uint32_t)(n - drawn));
        __builtin_prefetch(&out[z[drawn]], 1);
    }
    for (int64_t i = 0; i < last; i++) {
        int64_t j = z[i & (TR_AHEAD - 1)];
        if (drawn < last) {
            z[drawn & (TR_AHEAD - 1)] = drawn + (int64_t)(next32(g) % (uint32_t)(n - drawn));
            __builtin_prefetch(&out[z[drawn & (TR_AHEAD - 1)]], 1);
            drawn++;
        }
        int64_t sav = out[i];
        out[i] = out[j];
        out[j] = sav;
    }
}

/* torch.randint(high, size=(k,)) for high < 2**32 (random_from_to): one word each */
void tr_randint(tr_mt *g, int64_t high, int64_t k, int64_t *out)
{
    for (int64_t i = 0; i < k; i++)
        out[i] = (int64_t)(next32(g) % (uint64_t)high);
}
