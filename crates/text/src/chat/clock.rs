//! `strftime_now(format)`: the time a template is rendered at, formatted as
//! Python's `datetime.strftime` formats it in the C locale. The time comes
//! from the render call (UTC), so tests can fix it.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// A civil date and time, UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DateTime {
    year: i64,
    /// 1 to 12.
    month: u32,
    /// 1 to 31.
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// Days since 1970-01-01, for the weekday.
    days: i64,
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl DateTime {
    /// `time` in UTC; times before 1970 read as 1970-01-01.
    pub(super) fn utc(time: SystemTime) -> Self {
        let secs = time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2));
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Self {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem / 60 % 60) as u32,
            second: (rem % 60) as u32,
            days,
        }
    }

    /// 0 = Sunday.
    fn weekday(&self) -> usize {
        (self.days + 4).rem_euclid(7) as usize
    }

    fn is_leap(&self) -> bool {
        (self.year % 4 == 0 && self.year % 100 != 0) || self.year % 400 == 0
    }

    /// Day of the year, 1 to 366.
    fn yday(&self) -> u32 {
        const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap = u32::from(self.is_leap() && self.month > 2);
        BEFORE[(self.month - 1) as usize] + self.day + leap
    }

    /// `format` with C's `strftime` directives, as glibc writes them in the
    /// C locale. An unknown directive is written as it stands, as glibc does.
    pub(super) fn strftime(&self, format: &str) -> String {
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(d) = chars.next() else {
                out.push('%');
                break;
            };
            self.directive(&mut out, d);
        }
        out
    }

    fn directive(&self, out: &mut String, d: char) {
        let weekday = WEEKDAYS[self.weekday()];
        let month = MONTHS[(self.month - 1) as usize];
        let hour12 = match self.hour % 12 {
            0 => 12,
            h => h,
        };
        let _ = match d {
            'a' => write!(out, "{}", &weekday[..3]),
            'A' => write!(out, "{weekday}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'B' => write!(out, "{month}"),
            'c' => write!(
                out,
                "{} {} {:>2} {:02}:{:02}:{:02} {}",
                &weekday[..3],
                &month[..3],
                self.day,
                self.hour,
                self.minute,
                self.second,
                self.year
            ),
            'C' => write!(out, "{:02}", self.year.div_euclid(100)),
            'd' => write!(out, "{:02}", self.day),
            'D' | 'x' => write!(
                out,
                "{:02}/{:02}/{:02}",
                self.month,
                self.day,
                self.year.rem_euclid(100)
            ),
            'e' => write!(out, "{:>2}", self.day),
            'F' => write!(out, "{}-{:02}-{:02}", self.year, self.month, self.day),
            'H' => write!(out, "{:02}", self.hour),
            'I' => write!(out, "{hour12:02}"),
            'j' => write!(out, "{:03}", self.yday()),
            'k' => write!(out, "{:>2}", self.hour),
            'l' => write!(out, "{hour12:>2}"),
            'm' => write!(out, "{:02}", self.month),
            'M' => write!(out, "{:02}", self.minute),
            'n' => writeln!(out),
            'p' => write!(out, "{}", if self.hour < 12 { "AM" } else { "PM" }),
            'P' => write!(out, "{}", if self.hour < 12 { "am" } else { "pm" }),
            'R' => write!(out, "{:02}:{:02}", self.hour, self.minute),
            's' => write!(
                out,
                "{}",
                self.days * 86_400 + i64::from(self.hour * 3600 + self.minute * 60 + self.second)
            ),
            'S' => write!(out, "{:02}", self.second),
            't' => write!(out, "\t"),
            'T' | 'X' => write!(
                out,
                "{:02}:{:02}:{:02}",
                self.hour, self.minute, self.second
            ),
            'u' => write!(
                out,
                "{}",
                if self.weekday() == 0 {
                    7
                } else {
                    self.weekday()
                }
            ),
            'w' => write!(out, "{}", self.weekday()),
            'y' => write!(out, "{:02}", self.year.rem_euclid(100)),
            'Y' => write!(out, "{}", self.year),
            // A naive datetime, as transformers' `datetime.now()`, has no zone.
            'z' | 'Z' => Ok(()),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
}

/// (year, month, day) of the day `days` after 1970-01-01, in the
/// proleptic Gregorian calendar (counted in 400-year eras from 0000-03-01).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> DateTime {
        DateTime::utc(UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn formats_as_python_strftime() {
        // 2026-01-02 14:05:09 UTC, a Friday.
        let t = at(1_767_362_709);
        assert_eq!(t.strftime("%Y-%m-%d"), "2026-01-02");
        assert_eq!(t.strftime("%d %b %Y"), "02 Jan 2026");
        assert_eq!(t.strftime("%B %d, %Y"), "January 02, 2026");
        assert_eq!(
            t.strftime("%A %a %H:%M:%S %I%p %j"),
            "Friday Fri 14:05:09 02PM 002"
        );
        assert_eq!(
            t.strftime("%c|%x|%X|%e|%Z|%%|%Q"),
            "Fri Jan  2 14:05:09 2026|01/02/26|14:05:09| 2||%|%Q"
        );
    }

    #[test]
    fn calendar_edges() {
        assert_eq!(at(0).strftime("%F %T %A"), "1970-01-01 00:00:00 Thursday");
        // 2024-02-29 23:59:59, leap day.
        assert_eq!(
            at(1_709_251_199).strftime("%F %T %j %a"),
            "2024-02-29 23:59:59 060 Thu"
        );
        // 2000-12-31, day 366 of a leap century year.
        assert_eq!(at(978_220_800).strftime("%F %j"), "2000-12-31 366");
    }
}
