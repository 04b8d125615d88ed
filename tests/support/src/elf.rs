//! A copy of a shared library that no longer exports some symbols, as an older
//! driver's `libnvidia-ml.so` that predates them: the copy's dynamic symbol
//! table marks them local, which is what a linker version script
//! (`{ local: name; };`) does at link time. The dynamic loader ignores local
//! symbols, so `dlsym` fails for those names and for nothing else; no code
//! changes. Used with scenarios that list `missing_symbols`
//! (tests/fake-nvml/README.md).

use std::ffi::{c_void, CString};
use std::fs;
use std::path::Path;

/// `SHT_DYNSYM`, the section type of the dynamic symbol table.
const SHT_DYNSYM: u32 = 11;
/// `STB_LOCAL`, the binding the loader's symbol lookup skips.
const STB_LOCAL: u8 = 0;
/// `SHN_UNDEF`: a symbol the library imports, not one it defines.
const SHN_UNDEF: u16 = 0;

fn uint(data: &[u8], at: usize, width: usize) -> Result<u64, String> {
    let bytes = data
        .get(at..at + width)
        .ok_or_else(|| format!("ELF data ends before offset {}", at + width))?;
    Ok(bytes
        .iter()
        .rev()
        .fold(0u64, |value, &b| value << 8 | u64::from(b)))
}

fn index(value: u64) -> Result<usize, String> {
    usize::try_from(value).map_err(|e| e.to_string())
}

/// Marks the defined dynamic symbols named in `symbols` local in `data`, a
/// little-endian 64-bit ELF shared object. Every name must be found.
fn hide(data: &mut [u8], symbols: &[&str]) -> Result<(), String> {
    if data.get(..6) != Some(b"\x7fELF\x02\x01") {
        return Err("not a little-endian 64-bit ELF file".into());
    }
    let (shoff, shentsize, shnum) = (
        index(uint(data, 0x28, 8)?)?,
        index(uint(data, 0x3a, 2)?)?,
        index(uint(data, 0x3c, 2)?)?,
    );
    let section = |n: usize| shoff + n * shentsize;
    let dynsym = (0..shnum)
        .map(section)
        .find(|&at| uint(data, at + 4, 4) == Ok(u64::from(SHT_DYNSYM)))
        .ok_or("no dynamic symbol table")?;
    let (offset, size, entsize) = (
        index(uint(data, dynsym + 24, 8)?)?,
        index(uint(data, dynsym + 32, 8)?)?,
        index(uint(data, dynsym + 56, 8)?)?,
    );
    let strtab = section(index(uint(data, dynsym + 40, 4)?)?);
    let strings = index(uint(data, strtab + 24, 8)?)?;
    if entsize < 24 {
        return Err(format!("dynamic symbol entries of {entsize} bytes"));
    }
    let mut hidden = Vec::new();
    for entry in (offset..offset + size).step_by(entsize) {
        let name_at = strings + index(uint(data, entry, 4)?)?;
        let len = data[name_at.min(data.len())..]
            .iter()
            .position(|&b| b == 0)
            .ok_or("a symbol name runs past the end of the file")?;
        let name = &data[name_at..name_at + len];
        let defined = uint(data, entry + 6, 2)? != u64::from(SHN_UNDEF);
        if let Some(wanted) = symbols.iter().find(|s| s.as_bytes() == name) {
            if defined {
                // st_info: binding in the high four bits, type in the low four.
                data[entry + 4] = STB_LOCAL << 4 | (data[entry + 4] & 0xf);
                hidden.push(*wanted);
            }
        }
    }
    let absent: Vec<&&str> = symbols.iter().filter(|s| !hidden.contains(s)).collect();
    if absent.is_empty() {
        Ok(())
    } else {
        Err(format!("not exported, so not hidden: {absent:?}"))
    }
}

/// Whether `dlsym` finds `name` in the library `handle`.
fn exports(handle: *mut c_void, name: &str) -> bool {
    let name = CString::new(name).expect("a symbol name has no NUL");
    // SAFETY: a handle from dlopen, a NUL-terminated name; only the address is compared.
    !unsafe { libc::dlsym(handle, name.as_ptr()) }.is_null()
}

/// Writes to `dest` a copy of the library `lib` for which `dlsym` fails for each
/// of `symbols` and still finds `keep` (a symbol that must stay, to show the
/// copy loads and answers). Checks both by loading the copy.
pub fn library_without(
    lib: &Path,
    symbols: &[&str],
    keep: &str,
    dest: &Path,
) -> Result<(), String> {
    let mut data = fs::read(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    hide(&mut data, symbols).map_err(|e| format!("{}: {e}", lib.display()))?;
    fs::write(dest, &data).map_err(|e| format!("{}: {e}", dest.display()))?;
    let path = CString::new(dest.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: loads the copy (as the exporter does) only to look up symbols;
    // nothing in it is called.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen {} failed", dest.display()));
    }
    let still: Vec<&&str> = symbols.iter().filter(|s| exports(handle, s)).collect();
    let kept = exports(handle, keep);
    // SAFETY: the handle from dlopen above, used no more.
    unsafe { libc::dlclose(handle) };
    if !still.is_empty() {
        return Err(format!("{still:?} still exported by {}", dest.display()));
    }
    if !kept {
        return Err(format!("{} lacks {keep}", dest.display()));
    }
    Ok(())
}
