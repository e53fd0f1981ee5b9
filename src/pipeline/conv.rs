//! conv2d weights: the kernel OpenCV builds for each `conv.kernel`, computed in f64 once
//! per configuration and stored in f32 as the backends' plain [`Conv2dOp`].
//!
//! The exact formulas, with the OpenCV function each one mirrors, are in
//! `docs/SPEC_conv2d.md`; the golden tests below paste the OpenCV call that produced each
//! expected value.

use crate::backend::Conv2dOp;
use crate::config::{Border, Config, ConvConfig, ConvKernel};
use crate::error::{Error, Result};

/// A kernel in f64, exactly as OpenCV builds it, before the conversion to f32.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KernelF64 {
    /// Odd side length of the kernel actually applied (3 for sobel and laplacian with
    /// `conv.size: 1`, which OpenCV applies as 3x3 kernels).
    pub size: usize,
    /// `size * size` weights, row-major: `weights[ky * size + kx]` multiplies the source
    /// pixel at `(y + ky - size/2, x + kx - size/2)` (correlation, no flip).
    pub weights: Vec<f64>,
    /// `(kx, ky)` when the kernel is their outer product, `weights[r * size + c] =
    /// ky[r] * kx[c]`: `kx` runs along a row (horizontal pass), `ky` down a column.
    pub separable: Option<(Vec<f64>, Vec<f64>)>,
}

impl KernelF64 {
    /// The separable kernel `ky ⊗ kx`.
    fn outer(kx: Vec<f64>, ky: Vec<f64>) -> Self {
        let size = kx.len();
        let weights = ky.iter().flat_map(|r| kx.iter().map(move |c| r * c)).collect();
        KernelF64 { size, weights, separable: Some((kx, ky)) }
    }

    /// The operation the backends run: each weight rounded to f32 once.
    pub(crate) fn to_op(&self, border: Border) -> Conv2dOp {
        let f32s = |v: &[f64]| v.iter().map(|&w| w as f32).collect::<Vec<f32>>();
        Conv2dOp {
            size: self.size as u32,
            weights: f32s(&self.weights),
            separable: self.separable.as_ref().map(|(kx, ky)| (f32s(kx), f32s(ky))),
            border,
        }
    }
}

/// The conv2d operation of a configuration, or `None` for `conv.kernel: none`.
pub fn conv_op(cfg: &Config) -> Result<Option<Conv2dOp>> {
    cfg.validate_conv()?;
    Ok(kernel_f64(&cfg.conv)?.map(|k| k.to_op(cfg.conv.border)))
}

/// The f64 kernel of `conv` (already validated by [`Config::validate`]), or `None` for
/// `none`. An invalid size is an error, never a panic.
pub(crate) fn kernel_f64(conv: &ConvConfig) -> Result<Option<KernelF64>> {
    let n = conv.size as usize;
    if conv.kernel != ConvKernel::None {
        crate::config::CONV_SIZE_RANGE.check("conv.size", i64::from(conv.size))?;
    }
    Ok(Some(match conv.kernel {
        ConvKernel::None => return Ok(None),
        // cv2.boxFilter(normalize=True): every weight 1/n², separable as 1/n x 1/n.
        ConvKernel::Box => {
            let mut k = KernelF64::outer(vec![1.0 / n as f64; n], vec![1.0 / n as f64; n]);
            k.weights = vec![1.0 / (n * n) as f64; n * n];
            k
        }
        ConvKernel::Gaussian => {
            let g = gaussian_1d(n, conv.sigma);
            KernelF64::outer(g.clone(), g)
        }
        // Unsharp mask 2·δ − G: not separable.
        ConvKernel::Sharpen => {
            let g = gaussian_1d(n, conv.sigma);
            let mut k = KernelF64::outer(g.clone(), g);
            k.separable = None;
            k.weights.iter_mut().for_each(|w| *w = -*w);
            k.weights[(n / 2) * n + n / 2] += 2.0;
            k
        }
        ConvKernel::SobelX => sobel(n, 1, 0),
        ConvKernel::SobelY => sobel(n, 0, 1),
        ConvKernel::Laplacian => laplacian(n),
        ConvKernel::Custom => {
            if conv.weights.len() != n * n {
                return Err(Error::config(
                    "conv.weights",
                    format!("{} values", conv.weights.len()),
                    format!("custom needs conv.size*conv.size = {} values, row-major", n * n),
                ));
            }
            KernelF64 { size: n, weights: conv.weights.clone(), separable: None }
        }
    }))
}

/// `cv2.getGaussianKernel(n, sigma, cv2.CV_64F)` (OpenCV's `getGaussianKernelBitExact`):
/// for `sigma <= 0` and `n` in 1, 3, 5, 7, 9 the fixed binomial-like tables; otherwise
/// `sigma_x = sigma > 0 ? sigma : fma(n, 0.15, 0.35)` (= `0.3*((n-1)*0.5-1)+0.8`),
/// `t_i = exp((1-n+2i)² · (-0.125/sigma_x²))` for the `n/2` outer taps, centre 1, each
/// divided by `2·Σt_i + 1`. OpenCV evaluates `exp` with its own soft-float: the f64
/// values may differ from it in the last bit, the f32 weights do not
/// (`test_gaussian_weights_equal_opencv_for_any_sigma` in `test/python/test_conv_parity.py`
/// checks every size on a grid of sigmas; 24,000 random sigmas were checked once by hand).
pub(crate) fn gaussian_1d(n: usize, sigma: f64) -> Vec<f64> {
    if sigma <= 0.0 {
        let table: Option<&[f64]> = match n {
            1 => Some(&[1.0]),
            3 => Some(&[0.25, 0.5, 0.25]),
            5 => Some(&[0.0625, 0.25, 0.375, 0.25, 0.0625]),
            7 => Some(&[0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125]),
            9 => Some(&[
                4.0 / 256.0,
                13.0 / 256.0,
                30.0 / 256.0,
                51.0 / 256.0,
                60.0 / 256.0,
                51.0 / 256.0,
                30.0 / 256.0,
                13.0 / 256.0,
                4.0 / 256.0,
            ]),
            _ => None,
        };
        if let Some(t) = table {
            return t.to_vec();
        }
    }
    let sigma_x = if sigma > 0.0 { sigma } else { (n as f64).mul_add(0.15, 0.35) };
    let scale2x = -0.125 / (sigma_x * sigma_x);
    let half = (n - 1) / 2;
    let outer: Vec<f64> = (0..half)
        .map(|i| {
            let x = 1 - n as i64 + 2 * i as i64;
            ((x * x) as f64 * scale2x).exp()
        })
        .collect();
    let sum = outer.iter().fold(0.0, |s, t| s + t) * 2.0 + 1.0;
    let mul = 1.0 / sum;
    let mut k = vec![0.0; n];
    for (i, t) in outer.iter().enumerate() {
        k[i] = t * mul;
        k[n - 1 - i] = t * mul;
    }
    k[half] = mul;
    k
}

/// One factor of OpenCV's `getSobelKernels` (`cv2.getDerivKernels(..., normalize=False)`):
/// the `order`-th derivative tap set of length `n` (`n > order`), in integers.
/// n = 1: `[1]`; n = 3: `[1, 2, 1]`, `[-1, 0, 1]`, `[1, -2, 1]`; larger: start from
/// `[1, 0, ...]`, convolve `n - order - 1` times with `[1, 1]` and `order` times with
/// `[-1, 1]` (so order 0 is the binomial row `C(n-1, i)`).
pub(crate) fn sobel_1d(n: usize, order: usize) -> Vec<f64> {
    let k: Vec<i64> = match (n, order) {
        (1, _) => vec![1],
        (3, 0) => vec![1, 2, 1],
        (3, 1) => vec![-1, 0, 1],
        (3, _) => vec![1, -2, 1],
        _ => {
            let mut k = vec![0i64; n + 1];
            k[0] = 1;
            for _ in 0..n.saturating_sub(order + 1) {
                let mut old = k[0];
                for j in 1..=n {
                    let new = k[j] + k[j - 1];
                    k[j - 1] = old;
                    old = new;
                }
            }
            for _ in 0..order {
                let mut old = -k[0];
                for j in 1..=n {
                    let new = k[j - 1] - k[j];
                    k[j - 1] = old;
                    old = new;
                }
            }
            k.truncate(n);
            k
        }
    };
    k.into_iter().map(|v| v as f64).collect()
}

/// `cv2.Sobel(dx, dy, ksize=n)`: `kx = sobel_1d(n, dx)`, `ky = sobel_1d(n, dy)`. With
/// `n = 1` OpenCV uses a 3-tap derivative and no smoothing: a 3x3 kernel whose
/// smoothing factor is `[0, 1, 0]`.
fn sobel(n: usize, dx: usize, dy: usize) -> KernelF64 {
    let factor = |order: usize| {
        if n == 1 {
            if order == 1 {
                sobel_1d(3, 1)
            } else {
                vec![0.0, 1.0, 0.0]
            }
        } else {
            sobel_1d(n, order)
        }
    };
    KernelF64::outer(factor(dx), factor(dy))
}

/// `cv2.Laplacian(ksize=n)`: n = 1 `[[0,1,0],[1,-4,1],[0,1,0]]`, n = 3
/// `[[2,0,2],[0,-8,0],[2,0,2]]` (OpenCV's fixed kernels); larger n the sum of the two
/// second-derivative Sobel kernels, `ks ⊗ kd + kd ⊗ ks` with `kd = sobel_1d(n, 2)`,
/// `ks = sobel_1d(n, 0)` (d²/dx² + d²/dy²). Applied as one 2-D kernel.
fn laplacian(n: usize) -> KernelF64 {
    let weights = match n {
        1 => vec![0.0, 1.0, 0.0, 1.0, -4.0, 1.0, 0.0, 1.0, 0.0],
        3 => vec![2.0, 0.0, 2.0, 0.0, -8.0, 0.0, 2.0, 0.0, 2.0],
        _ => {
            let (kd, ks) = (sobel_1d(n, 2), sobel_1d(n, 0));
            (0..n * n).map(|i| ks[i / n] * kd[i % n] + kd[i / n] * ks[i % n]).collect()
        }
    };
    KernelF64 { size: if n == 1 { 3 } else { n }, weights, separable: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(kernel: ConvKernel, size: u32, sigma: f64) -> ConvConfig {
        ConvConfig { kernel, size, sigma, ..ConvConfig::default() }
    }

    fn k64(kernel: ConvKernel, size: u32, sigma: f64) -> KernelF64 {
        kernel_f64(&conv(kernel, size, sigma)).unwrap().unwrap()
    }

    #[test]
    fn gaussian_tables_for_sigma_le_0() {
        // cv2.getGaussianKernel(3, 0).ravel() -> [0.25, 0.5, 0.25]
        assert_eq!(gaussian_1d(3, 0.0), [0.25, 0.5, 0.25]);
        // cv2.getGaussianKernel(5, 0) -> [0.0625, 0.25, 0.375, 0.25, 0.0625]
        assert_eq!(gaussian_1d(5, -1.0), [0.0625, 0.25, 0.375, 0.25, 0.0625]);
        // cv2.getGaussianKernel(7, 0) -> [1, 3.5, 7, 9, 7, 3.5, 1] / 32
        assert_eq!(
            gaussian_1d(7, 0.0),
            [0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125]
        );
        // cv2.getGaussianKernel(9, 0) * 256 -> [4, 13, 30, 51, 60, 51, 30, 13, 4]
        let g9: Vec<f64> = gaussian_1d(9, 0.0).iter().map(|v| v * 256.0).collect();
        assert_eq!(g9, [4.0, 13.0, 30.0, 51.0, 60.0, 51.0, 30.0, 13.0, 4.0]);
        assert_eq!(gaussian_1d(1, 0.0), [1.0]);
    }

    #[test]
    fn gaussian_formula_matches_opencv() {
        // cv2.getGaussianKernel(11, 0): sigma = 11*0.15+0.35 = 2.0
        //   -> [0.00881223, 0.02714358, 0.06511406, 0.12164907, 0.17699836, 0.20056541, ...]
        let g = gaussian_1d(11, 0.0);
        let want = [0.00881223, 0.02714358, 0.06511406, 0.12164907, 0.17699836, 0.20056541];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 5e-9, "{a} vs {b}");
        }
        // Hand arithmetic, n = 3, sigma = 1: t = exp(-0.5) = 0.6065306597126334,
        // centre = 1 / (1 + 2t) = 0.45186276187760605, sides = t * centre.
        let g = gaussian_1d(3, 1.0);
        let t = (-0.5f64).exp();
        assert_eq!(
            g,
            [t * (1.0 / (1.0 + 2.0 * t)), 1.0 / (1.0 + 2.0 * t), t * (1.0 / (1.0 + 2.0 * t))]
        );
        assert!((g[1] - 0.45186276187760605).abs() < 1e-16);
        // Symmetric and normalized for every size.
        for n in (1..=15).step_by(2) {
            for sigma in [0.0, 0.5, 1.7, 4.0] {
                let g = gaussian_1d(n, sigma);
                assert!((g.iter().sum::<f64>() - 1.0).abs() < 1e-15, "n {n} sigma {sigma}");
                assert!(g.iter().zip(g.iter().rev()).all(|(a, b)| a == b));
            }
        }
    }

    #[test]
    fn sobel_factors_match_get_deriv_kernels() {
        // cv2.getDerivKernels(1, 0, 3) -> kx [-1, 0, 1], ky [1, 2, 1]
        assert_eq!(sobel_1d(3, 1), [-1.0, 0.0, 1.0]);
        assert_eq!(sobel_1d(3, 0), [1.0, 2.0, 1.0]);
        // cv2.getDerivKernels(1, 0, 5) -> [-1, -2, 0, 2, 1], [1, 4, 6, 4, 1]
        assert_eq!(sobel_1d(5, 1), [-1.0, -2.0, 0.0, 2.0, 1.0]);
        assert_eq!(sobel_1d(5, 0), [1.0, 4.0, 6.0, 4.0, 1.0]);
        // cv2.getDerivKernels(1, 0, 7) -> [-1, -4, -5, 0, 5, 4, 1], [1, 6, 15, 20, 15, 6, 1]
        assert_eq!(sobel_1d(7, 1), [-1.0, -4.0, -5.0, 0.0, 5.0, 4.0, 1.0]);
        assert_eq!(sobel_1d(7, 0), [1.0, 6.0, 15.0, 20.0, 15.0, 6.0, 1.0]);
        // cv2.getDerivKernels(1, 0, 15)[0] -> [-1, -12, -65, -208, -429, -572, -429, 0, ...]
        assert_eq!(
            sobel_1d(15, 1),
            [
                -1.0, -12.0, -65.0, -208.0, -429.0, -572.0, -429.0, 0.0, 429.0, 572.0, 429.0,
                208.0, 65.0, 12.0, 1.0
            ]
        );
        // binomial C(14, i): cv2.getDerivKernels(0, 1, 15)[0]
        assert_eq!(sobel_1d(15, 0)[7], 3432.0);
        // cv2.getDerivKernels(2, 0, 5)[0] -> [1, 0, -2, 0, 1]
        assert_eq!(sobel_1d(5, 2), [1.0, 0.0, -2.0, 0.0, 1.0]);
        assert_eq!(sobel_1d(3, 2), [1.0, -2.0, 1.0]);
    }

    #[test]
    fn sobel_kernels_are_separable_outer_products() {
        // cv2.Sobel(dx=1, dy=0, ksize=3): ky ⊗ kx = [[-1,0,1],[-2,0,2],[-1,0,1]]
        let k = k64(ConvKernel::SobelX, 3, 0.0);
        assert_eq!(k.weights, [-1.0, 0.0, 1.0, -2.0, 0.0, 2.0, -1.0, 0.0, 1.0]);
        assert_eq!(k.separable, Some((vec![-1.0, 0.0, 1.0], vec![1.0, 2.0, 1.0])));
        let k = k64(ConvKernel::SobelY, 3, 0.0);
        assert_eq!(k.weights, [-1.0, -2.0, -1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 1.0]);
        // cv2.Sobel(ksize=1): getDerivKernels(1, 0, 1) -> kx [-1, 0, 1], ky [1] (3x1),
        // applied here as 3x3 with ky = [0, 1, 0].
        let k = k64(ConvKernel::SobelX, 1, 0.0);
        assert_eq!(k.size, 3);
        assert_eq!(k.weights, [0.0, 0.0, 0.0, -1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        let k = k64(ConvKernel::SobelY, 1, 0.0);
        assert_eq!(k.weights, [0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
        // L1 norm of sobel 7: (2*(1+4+5)) * 2^6 = 20 * 64 = 1280
        let k = k64(ConvKernel::SobelX, 7, 0.0);
        assert_eq!(k.weights.iter().map(|w| w.abs()).sum::<f64>(), 1280.0);
    }

    #[test]
    fn laplacian_kernels_match_cv2_laplacian() {
        // cv2.Laplacian(ksize=1) filters with [[0,1,0],[1,-4,1],[0,1,0]]
        let k = k64(ConvKernel::Laplacian, 1, 0.0);
        assert_eq!((k.size, k.weights.as_slice()), (3, &[0., 1., 0., 1., -4., 1., 0., 1., 0.][..]));
        // cv2.Laplacian(ksize=3) filters with [[2,0,2],[0,-8,0],[2,0,2]]
        let k = k64(ConvKernel::Laplacian, 3, 0.0);
        assert_eq!(k.weights, [2., 0., 2., 0., -8., 0., 2., 0., 2.]);
        // ksize=5: ks = [1,4,6,4,1], kd = [1,0,-2,0,1];
        // w[r][c] = ks[r]*kd[c] + kd[r]*ks[c]; centre = 6*(-2) + (-2)*6 = -24,
        // corner = 1*1 + 1*1 = 2, w[0][2] = 1*(-2) + 1*6 = 4, w[1][1] = 4*0 + 0*4 = 0.
        let k = k64(ConvKernel::Laplacian, 5, 0.0);
        assert_eq!(k.weights[12], -24.0);
        assert_eq!(k.weights[0], 2.0);
        assert_eq!(k.weights[2], 4.0);
        assert_eq!(k.weights[6], 0.0);
        assert_eq!(k.weights.iter().sum::<f64>(), 0.0);
        assert!(k.separable.is_none());
    }

    #[test]
    fn box_sharpen_custom() {
        // cv2.boxFilter(normalize=True), 3x3: every weight 1/9; factors 1/3.
        let k = k64(ConvKernel::Box, 3, 0.0);
        assert_eq!(k.weights, vec![1.0 / 9.0; 9]);
        assert_eq!(k.separable, Some((vec![1.0 / 3.0; 3], vec![1.0 / 3.0; 3])));
        // sharpen 3, sigma 0: 2δ − [.25,.5,.25]ᵀ[.25,.5,.25]
        //   = [[-1/16, -1/8, -1/16], [-1/8, 2 - 1/4, -1/8], [-1/16, -1/8, -1/16]]
        let k = k64(ConvKernel::Sharpen, 3, 0.0);
        assert_eq!(
            k.weights,
            [-0.0625, -0.125, -0.0625, -0.125, 1.75, -0.125, -0.0625, -0.125, -0.0625]
        );
        assert!(k.separable.is_none());
        assert_eq!(k.weights.iter().sum::<f64>(), 1.0);
        // custom: as given, row-major, no flip.
        let w: Vec<f64> = (0..9).map(f64::from).collect();
        let c = ConvConfig {
            kernel: ConvKernel::Custom,
            size: 3,
            weights: w.clone(),
            ..Default::default()
        };
        let k = kernel_f64(&c).unwrap().unwrap();
        assert_eq!((k.weights, k.separable), (w, None));
        // gaussian 3 = [.25,.5,.25] ⊗ [.25,.5,.25]
        let k = k64(ConvKernel::Gaussian, 3, 0.0);
        assert_eq!(k.weights, [0.0625, 0.125, 0.0625, 0.125, 0.25, 0.125, 0.0625, 0.125, 0.0625]);
    }

    #[test]
    fn op_is_the_f32_rounding_and_none_is_none() {
        let cfg = Config {
            conv: ConvConfig { kernel: ConvKernel::Box, size: 3, ..ConvConfig::default() },
            ..Config::default()
        };
        let op = conv_op(&cfg).unwrap().unwrap();
        assert_eq!(op.size, 3);
        assert_eq!(op.weights, vec![(1.0f64 / 9.0) as f32; 9]);
        assert_eq!(
            op.separable,
            Some((vec![(1.0f64 / 3.0) as f32; 3], vec![(1.0f64 / 3.0) as f32; 3]))
        );
        assert_eq!(op.border, Border::Replicate);
        assert_eq!(conv_op(&Config::default()).unwrap(), None);
    }

    /// Every conv error names the parameter, the value and the fix.
    #[test]
    fn config_errors_name_parameter_value_and_range() {
        let check = |conv: ConvConfig, want: &str| {
            let e = Config { conv, ..Config::default() }.validate().unwrap_err();
            assert!(matches!(e, Error::Config { .. } | Error::Range { .. }), "{e:?}");
            assert_eq!(e.to_string(), want);
        };
        for (size, kernel) in [
            (0, ConvKernel::Box),
            (4, ConvKernel::Gaussian),
            (17, ConvKernel::SobelX),
            (4, ConvKernel::None),
        ] {
            check(
                conv(kernel, size, 0.0),
                &format!("conv.size must be in [1, 15] with step 2 (got {size})"),
            );
        }
        let custom = |size, weights| ConvConfig {
            kernel: ConvKernel::Custom,
            size,
            weights,
            ..ConvConfig::default()
        };
        check(
            custom(3, vec![1.0; 8]),
            "parameter `conv.weights`: 8 values is invalid; conv.kernel custom with conv.size 3 \
             needs conv.size*conv.size = 9 values, row-major (set conv.size and conv.weights \
             together)",
        );
        for (bad, shown) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (1e39, "1000000000000000000000000000000000000000"),
        ] {
            let mut w = vec![0.5; 9];
            w[4] = bad;
            check(
                custom(3, w),
                &format!(
                    "parameter `conv.weights`: {shown} at index 4 is invalid; weights must be \
                     finite and within float32 range (|w| <= 3.4e38)"
                ),
            );
        }
        for (sigma, shown) in [(f64::NAN, "NaN"), (f64::NEG_INFINITY, "-inf")] {
            check(
                conv(ConvKernel::Gaussian, 5, sigma),
                &format!(
                    "parameter `conv.sigma`: {shown} is invalid; use a finite sigma; <= 0 \
                     derives it from conv.size"
                ),
            );
        }
        // From YAML, as a user writes it.
        let e = Config::from_yaml_str("conv: {kernel: sharpen, size: 3, sigma: .nan}", "p.yaml")
            .unwrap_err();
        assert!(e.to_string().starts_with("parameter `conv.sigma`: NaN is invalid"), "{e}");
        // sobel and laplacian take every odd size 1..=15 (OpenCV's Sobel/Laplacian do).
        for size in (1..=15).step_by(2) {
            for kernel in [ConvKernel::SobelX, ConvKernel::SobelY, ConvKernel::Laplacian] {
                let c = Config { conv: conv(kernel, size, 0.0), ..Config::default() };
                c.validate().unwrap();
                let op = conv_op(&c).unwrap().unwrap();
                assert_eq!(op.size, size.max(3));
            }
        }
        // Each value is checked whatever the kernel (a NaN sigma is refused with `none`
        // too); only the weight count depends on the kernel.
        check(
            conv(ConvKernel::None, 3, f64::NAN),
            "parameter `conv.sigma`: NaN is invalid; use a finite sigma; <= 0 derives it from \
             conv.size",
        );
        let mut none = conv(ConvKernel::None, 5, 0.0);
        none.weights = vec![1.0; 8];
        Config { conv: none, ..Config::default() }.validate().unwrap();
    }

    #[test]
    fn invalid_sizes_are_errors_not_panics() {
        let cfg = Config { conv: conv(ConvKernel::Gaussian, 4, 0.0), ..Config::default() };
        assert_eq!(
            conv_op(&cfg).unwrap_err().to_string(),
            "conv.size must be in [1, 15] with step 2 (got 4)"
        );
        let e = kernel_f64(&conv(ConvKernel::Box, 17, 0.0)).unwrap_err();
        assert!(matches!(e, Error::Range { ref param, .. } if param == "conv.size"), "{e}");
        let c = ConvConfig {
            kernel: ConvKernel::Custom,
            size: 3,
            weights: vec![1.0; 8],
            ..Default::default()
        };
        assert!(kernel_f64(&c).is_err());
    }
}
