// A paged KV cache (backend.rs KvPages): row r's position p lives in cache
// row page_table[r * page_stride + (p >> page_log2)] << page_log2 | p %
// page_len. The including shader defines PAGED (a specialization bit, so
// an unpaged pass reads no table and computes nothing: position = cache
// row), KV_PAGES_BINDING and the push constants page_log2, page_stride and
// n_pages (vk/ops/kv_pages.rs PagePush).
layout(binding = KV_PAGES_BINDING) readonly buffer KvPageTable { uint page_table[]; };

// Row r's page number `index` as its table names it (unchecked).
uint kv_page(uint r, uint index) {
    return page_table[r * pc.page_stride + index];
}

// The cache row of position p in page `page`.
uint kv_page_row(uint page, uint p) {
    return (page << pc.page_log2) | (p & ((1u << pc.page_log2) - 1u));
}

#if defined(KV_PAGES_STORE)
// store_rows and rope_store: the cache row of row r's position p, or
// pc.capacity (the rows the cache holds) where it stores nothing: past the
// cache, or (paged) past its table or the pool.
uint kv_store_row(uint r, uint p) {
    if (!PAGED) {
        return min(p, pc.capacity);
    }
    uint base = r * pc.page_stride;
    uint index = p >> pc.page_log2;
    if (base >= pc.table_len || index >= pc.table_len - base) {
        return pc.capacity;
    }
    uint page = kv_page(r, index);
    return page < pc.n_pages ? kv_page_row(page, p) : pc.capacity;
}
#endif

#if defined(KV_PAGES_STATUS)
// The attention kernels never follow a page past the pool: it is recorded
// in the status words (the pass fails, as the CPU's does) and page 0 is
// read instead, so no load leaves the cache (the host refuses an empty
// pool).
uint kv_page_checked(uint r, uint index) {
    uint page = kv_page(r, index);
    if (page >= pc.n_pages) {
        atomicMax(st.bad_page_plus_one, min(page, 0xFFFFFFFEu) + 1u);
        return 0u;
    }
    return page;
}

// The cache row of row r's position p (p itself unpaged).
uint kv_row(uint r, uint p) {
    return PAGED ? kv_page_row(kv_page_checked(r, p >> pc.page_log2), p) : p;
}
#endif
