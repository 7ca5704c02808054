"""Classes of text a user may put in a conversation, for the token estimate's bands.

Shared by ``bench_tokens`` (the per-class table) and ``tests/test_token_classes.py``
(the band each class must stay within). Everything is deterministic: the prose is
written here, the code is this Python's own standard library, the rest is generated
from a seeded ``random.Random``.

Each language's sample is a few everyday sentences, the kind a user writes to an
assistant, in the language's usual script and spelling (combining marks, viramas
and joiners as typed).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import random
import string
import unicodedata
import uuid
from collections.abc import Callable

SEED = 11

#: A few sentences per language, by script.
LANGUAGES: dict[str, str] = {
    "French (Latin)": (
        "Bonjour, pourriez-vous m'aider à préparer la réunion de jeudi prochain ? "
        "Nous devons présenter le budget révisé à l'équipe financière et expliquer "
        "pourquoi les dépenses de déplacement ont augmenté de quinze pour cent. "
        "Merci de garder un ton sobre et de résumer les décisions déjà prises."
    ),
    "German (Latin)": (
        "Könnten Sie mir bitte erklären, warum die Lieferung für den Großkunden in "
        "München schon wieder verspätet ist? Laut Vertrag müssen wir Verzögerungen "
        "spätestens drei Werktage vorher ankündigen. Außerdem möchte ich wissen, "
        "ob die Rechnungsprüfung für das vierte Quartal abgeschlossen wurde."
    ),
    "Spanish (Latin)": (
        "¿Me puedes ayudar a escribir un correo para mi jefa? Quiero pedirle dos "
        "días libres la próxima semana porque mi hija tiene una operación pequeña. "
        "No sé cómo explicarlo sin sonar exagerado; ella es muy comprensiva, pero "
        "el equipo está saturado con el cierre del año."
    ),
    "Portuguese (Latin)": (
        "Olá! Estou planejando uma viagem de duas semanas pelo norte de Portugal e "
        "gostaria de sugestões de cidades pequenas, restaurantes tradicionais e "
        "trilhas que não sejam muito difíceis. Vou com a minha mãe, que já não "
        "consegue caminhar distâncias longas, então o ritmo precisa ser tranquilo."
    ),
    "Polish (Latin)": (
        "Dzień dobry, czy możesz mi pomóc przygotować listę zakupów na przyjęcie "
        "urodzinowe? Będzie około dwudziestu gości, w tym kilkoro dzieci i dwie "
        "osoby na diecie bezglutenowej. Chciałabym, żeby jedzenie było proste, "
        "ale żeby wszyscy się najedli i nikt nie czuł się pominięty."
    ),
    "Turkish (Latin)": (
        "Merhaba, yarın sabah İstanbul'dan Ankara'ya gitmem gerekiyor ama trenin "
        "saatini bulamıyorum. Ayrıca otelde kahvaltı dahil mi, öğrenebilir misin? "
        "Geçen sefer çok geç kalmıştım ve toplantıyı kaçırmıştım, bu yüzden bu kez "
        "erken çıkmak istiyorum."
    ),
    "Vietnamese (Latin)": (
        "Chào bạn, tôi muốn học tiếng Anh để đi làm ở một công ty nước ngoài. Mỗi "
        "ngày tôi chỉ có khoảng một tiếng sau giờ làm việc. Bạn có thể gợi ý cho "
        "tôi một kế hoạch học trong ba tháng được không? Tôi yếu nhất là phần nghe "
        "và phát âm."
    ),
    "Russian (Cyrillic)": (
        "Здравствуйте! Помогите, пожалуйста, составить письмо арендодателю: в "
        "квартире уже две недели не работает отопление, а на улице минус пятнадцать. "
        "Я несколько раз звонил, но мне обещают прислать мастера и никто не "
        "приходит. Хочу написать вежливо, но твёрдо."
    ),
    "Ukrainian (Cyrillic)": (
        "Привіт! Я хочу навчитися пекти домашній хліб на заквасці. Порадь, будь "
        "ласка, з чого почати, яке борошно краще купити і скільки часу потрібно, "
        "щоб закваска стала активною. У мене на кухні досить прохолодно, тому я "
        "переживаю, що тісто не підніметься."
    ),
    "Greek (Greek)": (
        "Καλησπέρα σας! Θα ήθελα να κλείσω ένα τραπέζι για έξι άτομα το Σάββατο "
        "βράδυ, γύρω στις εννιά. Ένας από τους καλεσμένους είναι αλλεργικός στους "
        "ξηρούς καρπούς, οπότε παρακαλώ ενημερώστε την κουζίνα. Υπάρχει "
        "δυνατότητα να καθίσουμε στη βεράντα αν ο καιρός είναι καλός;"
    ),
    "Arabic (Arabic)": (
        "مرحباً، أحتاج إلى مساعدتك في كتابة رسالة إلى مدير المدرسة. ابني مريض منذ "
        "ثلاثة أيام ولن يتمكن من حضور الامتحان يوم الأحد. هل يمكن أن يؤجل الامتحان "
        "إلى الأسبوع القادم؟ أريد أن تكون الرسالة مهذبة وواضحة ومختصرة."
    ),
    "Persian (Arabic)": (
        "سلام، می‌خواهم برای تعطیلات نوروز به شیراز سفر کنم. لطفاً چند هتل خوب و "
        "ارزان در نزدیکی حافظیه پیشنهاد بده. همچنین دوست دارم بدانم کدام رستوران‌ها "
        "غذاهای محلی خوبی دارند و بلیط قطار را از کجا باید بخرم."
    ),
    "Urdu (Arabic)": (
        "السلام علیکم، مجھے اپنے بیٹے کے لیے ایک اچھے ریاضی کے استاد کی تلاش ہے۔ وہ "
        "آٹھویں جماعت میں پڑھتا ہے اور اسے الجبرا سمجھنے میں مشکل ہوتی ہے۔ کیا آپ "
        "بتا سکتے ہیں کہ آن لائن ٹیوشن بہتر رہے گی یا گھر پر؟"
    ),
    "Hebrew (Hebrew)": (
        "שלום, אני מחפש דירה להשכרה בתל אביב, קרוב לתחנת רכבת. התקציב שלי הוא "
        "בערך שישה אלף שקלים לחודש. חשוב לי שתהיה מרפסת ושמותר להחזיק כלב קטן. "
        "תוכל לעזור לי לנסח מודעה קצרה לקבוצות בפייסבוק?"
    ),
    "Hindi (Devanagari)": (
        "नमस्ते, क्या आप मेरी मदद कर सकते हैं? मुझे अगले महीने अपनी बहन की शादी के "
        "लिए दिल्ली से जयपुर जाना है। मैं ट्रेन से जाना चाहता हूँ, लेकिन टिकट नहीं "
        "मिल रहे हैं। क्या कोई और सस्ता और आरामदायक तरीका है?"
    ),
    "Marathi (Devanagari)": (
        "नमस्कार, मला पुण्यात एक चांगले रुग्णालय शोधायचे आहे. माझ्या आजोबांना "
        "गुडघ्याचा त्रास आहे आणि डॉक्टरांनी शस्त्रक्रिया करायला सांगितली आहे. "
        "खर्च किती येईल आणि विमा त्यात मदत करेल का, हे समजून घ्यायचे आहे."
    ),
    "Bengali (Bengali)": (
        "নমস্কার, আমি আগামী সপ্তাহে কলকাতা থেকে ঢাকা যাচ্ছি। সীমান্তে কী কী কাগজপত্র "
        "লাগবে, সেটা কি আপনি বলতে পারবেন? আমার সঙ্গে আমার বাবা-মা থাকবেন, তাঁদের "
        "বয়স সত্তরের বেশি, তাই যাত্রাটা যতটা সম্ভব আরামদায়ক হওয়া দরকার।"
    ),
    "Punjabi (Gurmukhi)": (
        "ਸਤ ਸ੍ਰੀ ਅਕਾਲ ਜੀ, ਮੈਂ ਆਪਣੇ ਖੇਤ ਲਈ ਨਵਾਂ ਟਰੈਕਟਰ ਖਰੀਦਣ ਬਾਰੇ ਸੋਚ ਰਿਹਾ ਹਾਂ। "
        "ਕੀ ਤੁਸੀਂ ਦੱਸ ਸਕਦੇ ਹੋ ਕਿ ਬੈਂਕ ਤੋਂ ਕਰਜ਼ਾ ਲੈਣ ਲਈ ਕਿਹੜੇ ਕਾਗਜ਼ ਚਾਹੀਦੇ ਹਨ? "
        "ਮੇਰੇ ਕੋਲ ਦਸ ਏਕੜ ਜ਼ਮੀਨ ਹੈ ਅਤੇ ਮੈਂ ਕਣਕ ਤੇ ਝੋਨਾ ਬੀਜਦਾ ਹਾਂ।"
    ),
    "Gujarati (Gujarati)": (
        "નમસ્તે, મારે મારી દુકાન માટે હિસાબ રાખવાનું સરળ સોફ્ટવેર જોઈએ છે. "
        "રોજના આશરે પચાસ ગ્રાહકો આવે છે અને મોટાભાગનું વેચાણ રોકડમાં થાય છે. "
        "શું તમે કોઈ મફત અથવા ઓછી કિંમતનો વિકલ્પ સૂચવી શકો?"
    ),
    "Tamil (Tamil)": (
        "வணக்கம், நான் அடுத்த மாதம் சென்னையிலிருந்து மதுரைக்குக் குடும்பத்துடன் "
        "பயணம் செய்யப் போகிறேன். அங்கே பார்க்க வேண்டிய கோயில்கள் மற்றும் நல்ல "
        "சைவ உணவகங்கள் பற்றிச் சொல்ல முடியுமா? எங்களுடன் இரண்டு சிறு "
        "குழந்தைகளும் வருகிறார்கள்."
    ),
    "Telugu (Telugu)": (
        "నమస్కారం, నేను హైదరాబాద్‌లో కొత్త ఉద్యోగంలో చేరాను. ఆఫీసు దగ్గరలో "
        "తక్కువ అద్దెకు మంచి ఇల్లు ఎక్కడ దొరుకుతుందో చెప్పగలరా? నా భార్య కూడా "
        "ఉద్యోగం చేస్తుంది, కాబట్టి మెట్రో స్టేషన్ దగ్గర ఉంటే బాగుంటుంది."
    ),
    "Kannada (Kannada)": (
        "ನಮಸ್ಕಾರ, ನನ್ನ ಮಗಳಿಗೆ ಬೆಂಗಳೂರಿನಲ್ಲಿ ಒಳ್ಳೆಯ ಶಾಲೆ ಹುಡುಕುತ್ತಿದ್ದೇನೆ. ಅವಳು "
        "ಈಗ ಐದನೇ ತರಗತಿಯಲ್ಲಿ ಓದುತ್ತಿದ್ದಾಳೆ ಮತ್ತು ಸಂಗೀತದಲ್ಲಿ ತುಂಬಾ ಆಸಕ್ತಿ ಇದೆ. "
        "ಶುಲ್ಕ ಹೆಚ್ಚು ಇರಬಾರದು ಮತ್ತು ಮನೆಯಿಂದ ದೂರ ಇರಬಾರದು."
    ),
    "Malayalam (Malayalam)": (
        "നമസ്കാരം, ഞാൻ അടുത്ത ആഴ്ച കൊച്ചിയിൽ നിന്ന് മൂന്നാറിലേക്ക് പോകുന്നു. "
        "അവിടെ താമസിക്കാൻ നല്ല ഒരു ഹോംസ്റ്റേ നിർദ്ദേശിക്കാമോ? തേയിലത്തോട്ടങ്ങൾ "
        "കാണാനും കുറച്ച് നടക്കാനും ആണ് ഞങ്ങളുടെ പ്ലാൻ."
    ),
    "Sinhala (Sinhala)": (
        "ආයුබෝවන්, මට කොළඹ සිට මහනුවරට දුම්රියෙන් යන්න ඕනේ. ටිකට් පත් "
        "කලින් වෙන් කරගන්න පුළුවන්ද? මගේ අම්මා එක්ක යන නිසා පළමු පන්තියේ "
        "ආසන හොඳයි කියලා හිතනවා."
    ),
    "Thai (Thai)": (
        "สวัสดีครับ ผมอยากไปเที่ยวเชียงใหม่ช่วงปลายปีกับครอบครัว ช่วยแนะนำที่พัก"
        "ที่อยู่ใกล้ตัวเมืองและราคาไม่แพงมากได้ไหมครับ ลูกสาวผมอายุแปดขวบ "
        "อยากไปดูช้างและเดินตลาดกลางคืนด้วย"
    ),
    "Burmese (Myanmar)": (
        "မင်္ဂလာပါ၊ ကျွန်တော် ရန်ကုန်ကနေ မန္တလေးကို ရထားနဲ့ သွားချင်ပါတယ်။ "
        "လက်မှတ်ကို ဘယ်မှာ ဝယ်ရမလဲ၊ ခရီးက ဘယ်လောက်ကြာမလဲ ပြောပြပေးပါ။"
    ),
    "Khmer (Khmer)": (
        "សួស្តី ខ្ញុំចង់ទៅលេងសៀមរាបនៅខែក្រោយជាមួយគ្រួសារ។ តើអ្នកអាចណែនាំសណ្ឋាគារល្អៗដែលនៅជិតប្រាសាទអង្គរវត្តបានទេ?"
    ),
    "Georgian (Georgian)": (
        "გამარჯობა, მინდა თბილისიდან ბათუმში წასვლა მატარებლით. შეგიძლიათ "
        "მითხრათ, რამდენი ღირს ბილეთი და რა დრო სჭირდება მგზავრობას? "
        "ჩემთან ერთად ორი პატარა ბავშვი იმოგზაურებს."
    ),
    "Armenian (Armenian)": (
        "Բարև Ձեզ, ես ուզում եմ սովորել հայերեն գրել և կարդալ։ Կարո՞ղ եք "
        "խորհուրդ տալ լավ դասագիրք կամ առցանց դասընթաց։ Ամեն օր կարող եմ "
        "մեկ ժամ պարապել։"
    ),
    "Amharic (Ethiopic)": (
        "ሰላም፣ ከአዲስ አበባ ወደ ባሕር ዳር በአውቶቡስ መሄድ እፈልጋለሁ። ጉዞው ምን ያህል "
        "ሰዓት ይወስዳል? ትኬቱን አስቀድሜ መግዛት አለብኝ ወይስ እዚያው መግዛት ይቻላል?"
    ),
    "Japanese (kana, kanji)": (
        "こんにちは。来週の金曜日に大阪で取引先との打ち合わせがあるので、新幹線の"
        "切符を予約したいです。朝九時までに着きたいのですが、何時の電車に乗れば"
        "いいでしょうか。それから、駅の近くで静かなホテルも教えてください。"
    ),
    "Korean (Hangul)": (
        "안녕하세요, 다음 달에 부모님을 모시고 제주도로 여행을 가려고 합니다. "
        "어르신들이 많이 걷기 힘드셔서 차로 이동하기 편한 일정으로 추천해 주실 수 "
        "있을까요? 바다가 보이는 조용한 숙소면 더 좋겠습니다."
    ),
    "Dhivehi (Thaana)": ("އައްސަލާމު ޢަލައިކުމް. މާދަމާ ހެނދުނު މާލެއިން ހުޅުމާލެއަށް ދާން ބޭނުންވޭ. ބަސް ދުއްވާ ގަޑި ބުނެދެވިދާނެތަ؟ ޝުކުރިއްޔާ."),
    "Assyrian (Syriac)": (
        "ܫܠܡܐ ܥܠܘܟ. ܐܝܟܢܐ ܐܝܬܝܟ؟ ܐܢܐ ܒܥܝܢ ܠܡܐܙܠ ܠܫܘܩܐ ܥܡ ܐܚܘܢܝ ܝܘܡܐ ܕܥܪܘܒܬܐ. ܐܝܬ ܠܟ ܙܒܢܐ ܠܡܐܬܝ ܥܡܢ؟"
    ),
    "Manding (N'Ko)": ("ߌ ߣߌ߫ ߛߐ߲߬ߜߐ߫. ߒ ߓߘߊ߫ ߕߊ߯ ߟߐ߯ߝߍ ߟߊ߫ ߛߎ߬ߡߊ߲߬ߘߊ߲߫ ߞߊ߬ ߡߊ߬ߝߍ߬ߣߍ߲ ߛߊ߲߬. ߊߟߎ߫ ߓߍ߯ ߞߍ߫ ߌ ߞߍߟߊ߫ ߘߌ߫؟"),
    "Inuktitut (Canadian syllabics)": (
        "ᐊᐃᖓᐃ, ᖃᐅᔨᒪᔪᖓ ᐅᓪᓗᒥ ᐃᖃᓗᒃᓴᖅᑐᖃᕐᓂᐊᖅᑐᖅ ᑕᓯᐅᑉ ᓯᓈᓂ. ᖃᓄᐃᓕᐅᖅᑐᖃᕐᓂᐊᖅᐸ ᓯᓚ ᐊᓂᖅᑐᖃᕐᐸᑦ? ᖁᔭᓐᓇᒦᒃ."
    ),
    "Cherokee (Cherokee)": (
        "ᎣᏏᏲ! ᏙᎯᏧ? ᎣᏍᏛ ᎠᏆᏛᎦ, ᎤᏙᎯᏳ ᎦᎵᏉᎩ ᏧᏒᎯᏛ ᏥᏅᎩ ᏣᎳᎩ ᎠᏕᎶᏆᏍᏗ ᎠᏆᏚᎵ. ᎭᏢ ᏣᏕᎶᏆᏍᏗᏍᎪ? ᏩᏙ."
    ),
    "Tamazight (Tifinagh)": (
        "ⴰⵣⵓⵍ ⴼⵍⵍⴰⴽ, ⵎⴰⵏⵣⴰⴽⵉⵏ? ⵔⵉⵖ ⴰⴷ ⴷⴷⵓⵖ ⵙ ⵜⵎⴷⵉⵏⵜ ⴰⵙⴽⴽⴰ ⴷ ⵢⵉⵡⵏ ⵓⵎⴷⴷⴰⴽⴽⵍ. "
        "ⵎⴰⵏⵉ ⵍⵍⴰⵏ ⵉⴽⴰⵕⵕⵓⵙⵏ? ⵜⴰⵏⵎⵎⵉⵔⵜ."
    ),
    "Javanese (Javanese script)": (
        "ꦱꦸꦒꦼꦁꦫꦮꦸꦃ, ꦏꦥꦤ꧀ ꦥꦚ꧀ꦗꦼꦤꦼꦔꦤ꧀ ꦠꦶꦤꦏ꧀ꦲꦶꦁ ꦱꦺꦴꦭꦺꦴ? ꦲꦏꦸ ꦏꦥꦺꦴꦁ ꦱꦶꦤꦲꦸ ꦧꦲꦱꦗꦮ ꦏꦤ꧀ꦛꦶ ꦧꦥꦏ꧀ꦭꦤ꧀ꦆꦧꦸ. ꦩꦠꦸꦂꦤꦸꦮꦸꦤ꧀."
    ),
}


def _rng() -> random.Random:
    return random.Random(SEED)


def python_source() -> str:
    """Real code: a few modules of this Python's standard library, as written."""
    import argparse
    import json.decoder
    import textwrap

    return "\n\n".join(inspect.getsource(m) for m in (textwrap, json.decoder, argparse))


def json_records(*, indent: int | None = None) -> str:
    """API-style JSON: records with ids, names, amounts, dates, flags and nesting."""
    rng = _rng()
    names = ["Alice Martin", "Bo Chen", "Carlos Díaz", "Dana Kowalski", "Eitan Levi"]
    records = [
        {
            "id": rng.randrange(10**6, 10**7),
            "name": rng.choice(names),
            "email": f"user{rng.randrange(1000)}@example.com",
            "amount": round(rng.uniform(1, 10_000), 2),
            "currency": rng.choice(["USD", "EUR", "JPY"]),
            "created_at": f"2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}T"
            f"{rng.randrange(24):02d}:{rng.randrange(60):02d}:00Z",
            "active": rng.random() < 0.5,
            "tags": rng.sample(["vip", "new", "churn-risk", "b2b", "eu"], 2),
            "address": {"city": rng.choice(["Berlin", "Austin", "Lyon"]), "zip": "10115"},
        }
        for _ in range(60)
    ]
    return json.dumps(records, indent=indent, ensure_ascii=False)


def base64_blob() -> str:
    """Random bytes as base64 (an inline attachment, a token, a signature)."""
    return base64.b64encode(_rng().randbytes(3000)).decode()


def base64_of_text() -> str:
    """Base64 of text and JSON: JWTs, data URIs, encoded configs (fewer digits)."""
    claims = {"sub": "1234567890", "name": "Jane Doe", "roles": ["admin", "billing"]}
    jwt = ".".join(
        base64.urlsafe_b64encode(json.dumps({**claims, "iat": 1716239022 + n}).encode())
        .decode()
        .rstrip("=")
        for n in range(3)
    )
    prose = " ".join(LANGUAGES[name] for name in ("French (Latin)", "German (Latin)"))
    return "\n".join(
        [f"Authorization: Bearer {jwt}"] * 10 + [base64.b64encode(prose.encode()).decode()]
    )


def hex_blob() -> str:
    """A hex dump with nothing between the bytes (a key, a payload)."""
    return _rng().randbytes(2000).hex()


def hex_digests() -> str:
    """SHA-256 and MD5 hex digests, one per line (checksums, commit ids)."""
    rng = _rng()
    lines = []
    for n in range(80):
        data = rng.randbytes(16)
        digest = hashlib.sha256(data) if n % 2 else hashlib.md5(data)
        lines.append(f"{digest.hexdigest()}  file_{n}.bin")
    return "\n".join(lines)


def api_keys() -> str:
    """Secrets as people paste them: provider-style keys in an env file."""
    rng = _rng()
    alnum = string.ascii_letters + string.digits

    def pick(alphabet: str, n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    lines = []
    for n in range(25):
        lines += [
            f"OPENAI_API_KEY=sk-proj-{pick(alnum + '-_', 48)}",
            f"GITHUB_TOKEN=ghp_{pick(alnum, 36)}",
            f"AWS_ACCESS_KEY_ID=AKIA{pick(string.ascii_uppercase + string.digits, 16)}",
            f"AWS_SECRET_ACCESS_KEY={pick(alnum + '+/', 40)}",
            f"STRIPE_KEY_{n}=sk_live_{pick(alnum, 24)}",
        ]
    return "\n".join(lines)


def uuids() -> str:
    """UUIDs, as ids in a list or a log."""
    rng = _rng()
    return "\n".join(f"{n}. {uuid.UUID(int=rng.getrandbits(128), version=4)}" for n in range(150))


def random_strings() -> str:
    """Passwords and random identifiers of letters, digits and symbols."""
    rng = _rng()
    alphabet = string.ascii_letters + string.digits + "!@#$%^&*()-_=+[]{};:,.<>?"
    return "\n".join(
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(12, 33))) for _ in range(120)
    )


def lowercase_ids() -> str:
    """Random lowercase identifiers (slugs, short links, session ids)."""
    rng = _rng()
    alphabet = string.ascii_lowercase + string.digits
    return " ".join(
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(8, 21))) for _ in range(200)
    )


def urls() -> str:
    """Links with paths, query strings and fragments."""
    rng = _rng()
    hosts = [
        "github.com",
        "docs.python.org",
        "www.example.com",
        "api.stripe.com",
        "en.wikipedia.org",
    ]
    words = ["issues", "pull", "search", "v1", "customers", "wiki", "library", "reference", "blob"]
    lines = []
    for _ in range(120):
        path = "/".join(rng.choice(words) for _ in range(rng.randrange(1, 5)))
        query = f"?q={rng.choice(words)}&page={rng.randrange(1, 50)}&id={rng.getrandbits(40):x}"
        lines.append(f"https://{rng.choice(hosts)}/{path}{query}#L{rng.randrange(1, 900)}")
    return "\n".join(lines)


#: The spans of a North American phone number's three parts.
PHONE_PARTS = ((200, 999), (100, 999), (1000, 9999))


def numbers() -> str:
    """Numbers in prose and lists: amounts, measurements, phone numbers, dates."""
    rng = _rng()

    def line() -> str:
        day, month, year = rng.randrange(1, 32), rng.randrange(1, 13), rng.randrange(10, 30)
        paid = f"${rng.randrange(1, 99_999):,}.{rng.randrange(100):02d}"
        weight = f"{rng.uniform(0, 500):.3f} kg"
        phone = "-".join(str(rng.randrange(*span)) for span in PHONE_PARTS)
        return f"{day}/{month}/20{year}: paid {paid}, weight {weight}, call +1 {phone}"

    return "\n".join(line() for _ in range(120))


def csv_table() -> str:
    """A numeric CSV table, as exported from a spreadsheet."""
    rng = _rng()
    rows = ["date,region,units,price,revenue,margin"]
    for _ in range(150):
        units, price = rng.randrange(1, 5000), rng.uniform(0.5, 300)
        rows.append(
            f"2024-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d},"
            f"{rng.choice(['north', 'south', 'east', 'west'])},{units},{price:.2f},"
            f"{units * price:.2f},{rng.uniform(-0.2, 0.6):.4f}"
        )
    return "\n".join(rows)


def markdown_table() -> str:
    """A Markdown table with padded columns, as a model writes one."""
    rng = _rng()
    rows = [
        "| Product        | Q1      | Q2      | Change  |",
        "|----------------|---------|---------|---------|",
    ]
    for n in range(80):
        q1, q2 = rng.randrange(100, 99_999), rng.randrange(100, 99_999)
        rows.append(f"| Item {n:<9} | {q1:>7} | {q2:>7} | {(q2 - q1) / q1:>+7.1%} |")
    return "\n".join(rows)


def emoji_chat() -> str:
    """Chat with emoji: faces, hearts, skin tones, ZWJ families and flags."""
    rng = _rng()
    emoji = ["😀", "😂", "🥲", "❤️", "👍🏽", "🎉", "🙏", "🔥", "👨‍👩‍👧", "🇯🇵", "✅", "🤔", "😭"]
    words = ["haha", "see you", "thanks", "so good", "omg", "ok", "love it", "on my way"]
    return "\n".join(
        f"{rng.choice(words)} {''.join(rng.choice(emoji) for _ in range(rng.randrange(1, 5)))}"
        for _ in range(150)
    )


def emoji_only() -> str:
    """Emoji with nothing between them (a reaction storm)."""
    rng = _rng()
    emoji = ["😀", "😂", "🥲", "❤️", "👍🏽", "🎉", "🙏", "🔥", "👨‍👩‍👧", "🇯🇵", "✅", "🤔", "😭"]
    return "".join(rng.choice(emoji) for _ in range(600))


def math_notation() -> str:
    """Formulas in Unicode: operators, Greek letters, sub- and superscripts."""
    lines = [
        "∀x∈ℝ: f(x) ≤ ∑ᵢ αᵢ·xᵢ² and ∫₀¹ g(t) dt ≠ ∞",
        "A ⊆ B ⊂ C, A ∩ B = ∅, |A ∪ B| ≥ 3 → P(A|B) ≈ 0.42 ± 0.01",
        "λ = 2π/ω, ∂u/∂t = κ∇²u, det(M) = ∏ⱼ λⱼ",
    ]
    return "\n".join(lines * 40)


def box_table() -> str:
    """A table drawn with box-drawing lines, as terminals print them."""
    rng = _rng()
    rows = [
        "┌────────┬──────────┬────────┐",
        "│ name   │ status   │ time   │",
        "├────────┼──────────┼────────┤",
    ]
    rows += [
        f"│ job-{n:<3}│ {rng.choice(['done', 'failed', 'running']):<9}│ "
        f"{rng.uniform(0, 99):>6.2f} │"
        for n in range(60)
    ]
    return "\n".join([*rows, "└────────┴──────────┴────────┘"])


_WORDS = (
    "the invoice customer total amount due paid status region north quarter report "
    "meeting tomorrow review draft send approve reject pending shipment order"
).split()


def word_per_line() -> str:
    """One word per line (a list pasted from a column)."""
    rng = _rng()
    return "\n".join(rng.choice(_WORDS) for _ in range(1500))


def short_lines() -> str:
    """A checklist: short lines, a blank line between groups."""
    rng = _rng()
    groups = []
    for g in range(60):
        items = [
            f"- [ ] {rng.choice(_WORDS)} {rng.choice(_WORDS)}" for _ in range(rng.randrange(2, 6))
        ]
        groups.append(f"## Step {g}\n" + "\n".join(items))
    return "\n\n".join(groups)


def log_lines() -> str:
    """Application log lines: timestamps, levels, IPs, paths, durations."""
    rng = _rng()
    levels = ["INFO", "WARN", "ERROR", "DEBUG"]
    paths = ["/api/v1/orders", "/login", "/static/app.js", "/api/v1/invoices/export"]
    return "\n".join(
        f"2024-03-{rng.randrange(1, 29):02d} {rng.randrange(24):02d}:{rng.randrange(60):02d}:"
        f"{rng.randrange(60):02d},{rng.randrange(1000):03d} {rng.choice(levels)} "
        f"[worker-{rng.randrange(16)}] {rng.randrange(256)}.{rng.randrange(256)}."
        f"{rng.randrange(256)}.{rng.randrange(256)} GET {rng.choice(paths)} "
        f"{rng.choice([200, 201, 404, 500])} "
        f"{rng.uniform(0.1, 900):.1f}ms"
        for _ in range(150)
    )


def mixed_languages() -> str:
    """One conversation switching languages, with code and numbers between them."""
    parts = [
        "Can you translate this for our customers?",
        LANGUAGES["Russian (Cyrillic)"],
        "and the Hindi one:",
        LANGUAGES["Hindi (Devanagari)"],
        "```python\nfor row in rows:\n    total += row['amount'] * 1.19\n```",
        LANGUAGES["Arabic (Arabic)"],
        "Order #48213 ships on 2024-07-19 😀",
        LANGUAGES["Japanese (kana, kanji)"],
        LANGUAGES["Greek (Greek)"],
    ]
    return "\n".join(parts)


def control_characters() -> str:
    """Tool output with control characters: NUL padding of a record read as text,
    pdftotext's form feed between pages, a terminal's colour codes."""
    rng = _rng()
    records = [
        f"{rng.choice(_WORDS)}_{n}".ljust(24, "\x00") + f"{rng.randrange(10**6)}\x00\x00\x00\x00"
        for n in range(40)
    ]
    pages = [f"Page {n}\nThe {rng.choice(_WORDS)} is {rng.choice(_WORDS)}.\f" for n in range(40)]
    colours = [
        f"\x1b[3{rng.randrange(8)}m{rng.choice(_WORDS)}\x1b[0m \x1b[1m{n}\x1b[0m\r"
        for n in range(40)
    ]
    return "\n".join(records + pages + colours)


def separator_lines() -> str:
    """Console reports ruled by separator lines (pytest, psql, a Markdown rule)."""
    rng = _rng()
    blocks = []
    for n in range(25):
        blocks += [
            f"{'=' * 30} test session {n} starts {'=' * 30}",
            f"collected {rng.randrange(1, 500)} items",
            "-" * 78,
            f"{rng.choice(_WORDS)}_{n}.py ........{rng.choice(['.', 'F', 's'])}..... [100%]",
            "_" * 40 + f" {rng.choice(_WORDS)} " + "_" * 40,
            "*" * 20,
        ]
    return "\n".join(blocks)


def korean_nfd() -> str:
    """Korean decomposed into conjoining jamo (NFD), as macOS file names and text copied
    from them hold it."""
    return unicodedata.normalize("NFD", LANGUAGES["Korean (Hangul)"])


def pdf_arabic() -> str:
    """Arabic as some PDF extractors give it: presentation forms, one per letter shape."""
    return "\n".join(["ﺍﻟﺴﻼﻡ ﻋﻠﻴﻜﻢ ﻭﺭﺣﻤﺔ ﺍﻟﻠﻪ ﻭﺑﺮﻛﺎﺗﻪ", "ﺍﻟﻔﺎﺗﻮﺭﺓ ﺭﻗﻢ ١٢٣ ﻣﺴﺘﺤﻘﺔ ﺍﻟﺪﻓﻊ"] * 10)


def nfd_accents() -> str:
    """Vietnamese and French with their accents as combining marks (NFD), as text copied
    from macOS file names or some PDFs holds them."""
    return unicodedata.normalize(
        "NFD", LANGUAGES["Vietnamese (Latin)"] + "\n" + LANGUAGES["French (Latin)"]
    )


def phonetic() -> str:
    """Transcriptions in the International Phonetic Alphabet, as a dictionary gives them."""
    return "\n".join(
        [
            "invoice /ˈɪnvɔɪs/, schedule /ˈʃɛdʒuːl/ or /ˈskɛdʒuːl/, either /ˈaɪðər/",
            "ðə kwɪk braʊn fɒks dʒʌmps ˈoʊvər ðə ˈleɪzi dɔɡ",
            "aɪ θɪŋk ˈɛvriˌwʌn ʃʊd lɜrn ðə ˌɪntərˈnæʃənəl ˈfoʊnɛtɪk ˈælfəˌbɛt",
            "thought /θɔːt/, water /ˈwɔːtə/ (UK), /ˈwɑːtɚ/ (US), judge /dʒʌdʒ/",
        ]
    )


def pdf_ligatures() -> str:
    """English as some PDF extractors give it: ﬁ, ﬂ, ﬀ, ﬃ kept as one character each."""
    return " ".join(
        [
            "The ﬁrst ﬂoor of the oﬃce was ﬁlled with ﬁne ﬂowers, and the staﬀ found it",
            "diﬃcult to ﬁnd an eﬀective workﬂow. Please ﬁll in the ﬁnancial aﬃdavit and",
            "reﬂect the oﬀer in the ﬁnal ﬁgures before the ﬁscal deadline.",
        ]
    )


#: Generated and real samples of the other classes, by name.
STRUCTURED: dict[str, Callable[[], str]] = {
    "Python source (stdlib)": python_source,
    "JSON, compact": json_records,
    "JSON, indented": lambda: json_records(indent=2),
    "base64": base64_blob,
    "base64 of text (JWT)": base64_of_text,
    "hex blob": hex_blob,
    "hex digests": hex_digests,
    "API keys (.env)": api_keys,
    "UUIDs": uuids,
    "random strings": random_strings,
    "lowercase random ids": lowercase_ids,
    "URLs": urls,
    "numbers in lines": numbers,
    "CSV table": csv_table,
    "Markdown table": markdown_table,
    "log lines": log_lines,
    "math notation": math_notation,
    "box-drawing table": box_table,
    "emoji in chat": emoji_chat,
    "emoji only": emoji_only,
    "one word per line": word_per_line,
    "checklist (short lines)": short_lines,
    "mixed languages and code": mixed_languages,
    "control characters (NUL, form feed, ANSI)": control_characters,
    "separator lines (console report)": separator_lines,
    "Korean in NFD (conjoining jamo)": korean_nfd,
    "Arabic presentation forms (PDF)": pdf_arabic,
    "accents as combining marks (NFD)": nfd_accents,
    "phonetic transcription (IPA)": phonetic,
    "Latin ligatures (PDF)": pdf_ligatures,
}


def text_classes() -> dict[str, str]:
    """Every class's sample, by name: the languages, then the structured classes."""
    return {**LANGUAGES, **{name: make() for name, make in STRUCTURED.items()}}
